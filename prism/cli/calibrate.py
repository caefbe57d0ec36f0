"""Timing slices of S ranks (``live`` engine, the others virtual), then inter-slice calibration into
RUN/graph/timed (DESIGN §7). Prints per rank the uncalibrated and calibrated iteration time, and the
real run's when RUN/graph/real exists."""

from __future__ import annotations

import argparse
import json
import math

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prism.vrank_replayer.calibrate_run import CalibrateResult, calibrate_run, mean_measured_ns

from . import add_timeout_argument
from .devices import add_device_arguments, device_options

HELP = "time the ranks slice by slice and calibrate the graph (RUN/graph/timed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory (graph/bare or graph/real)")
    p.add_argument("--slice-size", type=int, default=2, help="ranks that run for real in each slice (S)")
    p.add_argument("--skip", type=int, default=None, help="warmup steps left out (default: iterations.warmup)")
    add_timeout_argument(p, default_s=600.0, what="each slice (and the capture run)")
    p.add_argument("--json", dest="json_out", default=None, help="also write the per-rank rows as JSON here")
    add_device_arguments(p)


def result_rows(result: CalibrateResult) -> dict[int, dict]:
    skip = result.report.skip_steps
    rows = {}
    for rank, rc in sorted(result.report.ranks.items()):
        real = result.real_steps_ns.get(rank)
        real_ms = mean_measured_ns(real, skip) / 1e6 if real else math.nan
        rows[rank] = {"uncalibrated_ms": rc.uncalibrated_step_ns / 1e6, "calibrated_ms": rc.calibrated_step_ns / 1e6,
                      "real_ms": real_ms,
                      "calibrated_error": (rc.calibrated_step_ns / 1e6 - real_ms) / real_ms if real else math.nan}
    return rows


def print_result(result: CalibrateResult, console: Console) -> None:
    table = Table(title=f"calibrate: {len(result.slices)} slices on graph/{result.structure}, first "
                        f"{result.report.skip_steps} step(s) skipped ({result.wall_s:.0f} s)", title_justify="left")
    for col in ("rank", "uncalibrated ms", "calibrated ms", "real run ms", "error vs real"):
        table.add_column(col, justify="right")
    for rank, row in result_rows(result).items():
        err = row["calibrated_error"]
        table.add_row(str(rank), f"{row['uncalibrated_ms']:.2f}", f"{row['calibrated_ms']:.2f}",
                      "—" if math.isnan(row["real_ms"]) else f"{row['real_ms']:.2f}",
                      "—" if math.isnan(err) else f"{err * 100:+.2f} %")
    console.print(table)
    console.print(f"iteration time: {result.report.uncalibrated_iteration_ns / 1e6:.2f} ms uncalibrated → "
                  f"{result.report.iteration_ns / 1e6:.2f} ms calibrated; timed graph: {result.timed_dir}")


def run(args: argparse.Namespace) -> int:
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("slices"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("calibrate", total=None)

        def on_slice(done: int, total: int, ranks: tuple[int, ...]) -> None:
            desc = f"slice ranks {','.join(map(str, ranks))}" if ranks else "calibrate"
            progress.update(task, completed=done, total=total, description=desc)

        result = calibrate_run(args.run_dir, slice_size=args.slice_size, skip_steps=args.skip,
                               timeout_s=args.timeout, on_slice=on_slice, device=device_options(args))
    print_result(result, console)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"ranks": result_rows(result), "iteration_ms": result.report.iteration_ns / 1e6,
                       "uncalibrated_iteration_ms": result.report.uncalibrated_iteration_ns / 1e6}, f, indent=2)
    return 0
