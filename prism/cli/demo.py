"""Record the bundled hybrid example (FSDP2 x TP x PP) at W=8 on this machine and show what each
rank did, then prism simulate's prediction beside the measured iteration times."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from prism.core.config import load_job
from prism.sandbox.recording import record_job

from .progress import rank_progress
from .report import print_run_table
from .simulate import print_simulation, simulate_run

HELP = "run the end-to-end demo on the bundled example"

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", default="hybrid", help="example under examples/ (default: hybrid)")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")


def run(args: argparse.Namespace) -> int:
    job_file = EXAMPLES / args.example / "job.yaml"
    job = load_job(job_file)
    console = Console()
    console.rule(f"prism demo: {job.name}, W={job.world_size}, {job.device}")
    with rank_progress(f"record {job.name}", job.world_size) as progress:
        graph = record_job(job, args.out, on_progress=progress)
    print_run_table(graph, title=f"{job.name}: real run recorded by prism (W={job.world_size})", skip_steps=job.iterations.warmup)
    print_simulation(simulate_run(args.out, "real", job.iterations.warmup), console)
    console.print(f"run directory: {Path(args.out).resolve()}")
    return 0
