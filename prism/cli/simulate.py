"""Predict each rank's iteration time from a recorded graph (DESIGN §7.2) and show it beside the
measured time: a compute lane per rank and one comm lane per group; a collective starts when all
members issued it and lasts its measured transfer time."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.errors import RunDirError
from prism.core.rundir import RunDir
from prism.core.strict_json import dumps_strict
from prism.graph.io import read_graph
from prism.graph.simulate import compare_steps, simulate

from . import non_negative_int

HELP = "predict iteration times from a run's graph"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory")
    p.add_argument("--graph", default=None, help="which graph: real, bare or timed (default: the newest present)")
    p.add_argument("--skip", type=non_negative_int, default=None, help="warmup steps left out (default: the job's iterations.warmup)")
    p.add_argument("--json", dest="json_out", default=None, help="also write the rows as JSON to this file")


def simulate_run(run_dir: str, graph_kind: str | None, skip: int | None) -> dict:
    """Library-level entry used by the command and the demo: per-rank predicted vs measured."""
    run = RunDir(Path(run_dir))
    kinds = [graph_kind] if graph_kind else ["timed", "real", "bare"]
    for kind in kinds:
        if (run.graph_dir(kind) / "manifest.pb").exists():
            break
    else:
        raise RunDirError(f"{run_dir}: no graph of kind {' or '.join(kinds)} under graph/")
    graph = read_graph(run.graph_dir(kind))
    if skip is None:
        skip = run.load_job().iterations.warmup if run.job_file.exists() else 1
    rows = compare_steps(graph, simulate(graph))
    per_rank = {}
    for rank in sorted(graph.nodes):
        mine = [r for r in rows if r.rank == rank and r.step >= skip and r.predicted_ns >= 0 and r.measured_ns > 0]
        if not mine:
            continue
        pred = statistics.fmean(r.predicted_ns for r in mine)
        meas = statistics.fmean(r.measured_ns for r in mine)
        per_rank[rank] = {
            "predicted_ms": pred / 1e6,
            "measured_ms": meas / 1e6,
            "rel_error": (pred - meas) / meas,
            "max_step_rel_error": max(abs(r.rel_error) for r in mine),
            "steps": len(mine),
        }
    return {"graph": kind, "skip_steps": skip, "ranks": per_rank}


def print_simulation(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"simulate ({result['graph']} graph, first {result['skip_steps']} step(s) skipped)",
                  title_justify="left")
    for col in ("rank", "predicted ms", "measured ms", "error", "max step error"):
        table.add_column(col, justify="right")
    for rank, row in result["ranks"].items():
        table.add_row(str(rank), f"{row['predicted_ms']:.2f}", f"{row['measured_ms']:.2f}",
                      f"{row['rel_error'] * 100:+.2f} %", f"{row['max_step_rel_error'] * 100:.2f} %")
    console.print(table)


def run(args: argparse.Namespace) -> int:
    result = simulate_run(args.run, args.graph, args.skip)
    print_simulation(result)
    if args.json_out:
        Path(args.json_out).write_text(dumps_strict(result, indent=2))
    return 0
