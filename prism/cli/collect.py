"""Run the job's logical ranks on K slots (context switching, rules, DP templates) and write RUN/graph/bare."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prism.coordinator import CollectOptions, CollectProgress, collect_job
from prism.core.config import job_from_dict, job_to_dict, load_job

from . import add_force_argument, add_timeout_argument, positive_int
from .report import print_run_table

HELP = "collect the bare graph of the job on K slots"
PROGRESS_LINE_S = 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job.yaml")
    p.add_argument("--out", required=True, help="run directory to write")
    add_force_argument(p)
    p.add_argument("--slots", type=positive_int, default=None, help="K, the number of slots (default: the job's slots)")
    add_timeout_argument(p, default_s=1800.0, stall=False)
    p.add_argument("--bind", default="",
                   help="address the coordinator listens on (default: loopback; every interface in a multi-node run)")
    p.add_argument("--token", default="", help="secret every worker must present (default: a fresh one per run)")
    p.add_argument("--templates", choices=["none", "dp"], default=None,
                   help="dp: run one DP replica, the manifest maps the others to it (default: the job's templates)")
    p.add_argument("--comm-inputs", choices=["context_switch", "recorded", "rules"], default=None,
                   help="where comm outputs come from (default: the job's comm_inputs.source)")
    p.add_argument("--json", action="store_true", help="print the collection figures as JSON")


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    if args.templates or args.comm_inputs:
        data = job_to_dict(job)
        if args.templates:
            data["templates"] = args.templates
        if args.comm_inputs:
            data.setdefault("comm_inputs", {})["source"] = args.comm_inputs
        job = job_from_dict(data, base_dir=job.base_dir, source=args.job)
    options = CollectOptions(slots=args.slots, timeout_s=args.timeout, bind=args.bind, token=args.token)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("ranks"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console) as bar:
        total = job.world_size // job.parallelism.dp if job.templates == "dp" and job.parallelism else job.world_size
        task = bar.add_task(f"collect {job.name}", total=total, detail="")
        printed_s = [0.0]

        def update(p: CollectProgress) -> None:
            detail = f"{p.collectives_resolved} collectives, {p.num_swaps} swaps"
            bar.update(task, completed=p.ranks_finished, detail=detail)
            # Not a terminal (a batch job, a pipe): the bar shows nothing until the end; a line a minute.
            if not console.is_terminal and p.elapsed_s - printed_s[0] >= PROGRESS_LINE_S:
                printed_s[0] = p.elapsed_s
                console.print(f"collect {job.name}: {p.ranks_finished}/{total} ranks finished, {detail}, "
                              f"{p.elapsed_s:.0f} s", highlight=False)

        result = collect_job(job, args.out, options, on_progress=update, replace=args.force)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        ran = (f", {result.num_ranks_run} ranks ran (DP templates)" if result.num_ranks_run < job.world_size else "")
        ruled = f", {result.num_by_rule} ops by rule" if result.num_by_rule else ""
        print_run_table(result.graph, title=f"{job.name}: collected on {result.num_slots} slots, W={job.world_size}"
                                             f"{ran}, {result.num_context_switches} context switches{ruled}, "
                                             f"{result.wall_s:.1f} s")
    return 0
