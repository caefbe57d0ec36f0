"""Timing slices of S ranks (``live`` engine, the others virtual), then inter-slice calibration into
RUN/graph/timed (DESIGN §7). Prints per rank the uncalibrated and calibrated iteration time, and the
real run's when RUN/graph/real exists."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prism.calibration import DEFAULT_MERGE, MERGES
from prism.core.strict_json import dumps_strict
from prism.vrank_replayer.calibrate_run import CalibrateResult, calibrate_run, mean_measured_ns

from . import add_timeout_argument, non_negative_int, positive_int
from .devices import add_device_arguments, device_options
from .report import print_host_speed, print_no_steps, print_tracked_recording

HELP = "time the ranks slice by slice and calibrate the graph (RUN/graph/timed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory (graph/bare or graph/real)")
    p.add_argument("--slice-size", type=positive_int, default=2, help="ranks that run for real in each slice (S)")
    p.add_argument("--skip", type=non_negative_int, default=None, help="warmup steps left out (default: iterations.warmup)")
    p.add_argument("--repeats", type=positive_int, default=1, metavar="N",
                   help="run each slice N times (default 1); --merge says how the takes become the timing")
    p.add_argument("--merge", choices=MERGES, default=DEFAULT_MERGE,
                   help="how each rank's takes become its timing: rotated (its spans step by step, the k-th measured "
                        "step from take k mod N: keeps the step-to-step jitter that makes a collective wait for "
                        "whoever was slow that step; the default) or median (each node its median over the steady "
                        "steps, then over the takes: every step typical); docs/emulate.md")
    add_timeout_argument(p, default_s=600.0, what="each slice (and the capture run)")
    p.add_argument("--json", dest="json_out", default=None, help="also write the per-rank rows as JSON here")
    add_device_arguments(p)


def result_rows(result: CalibrateResult) -> dict[int, dict]:
    """Per rank: times in ms, None where the rank has no steps (or no real run)."""
    skip = result.report.skip_steps
    rows = {}
    for rank, rc in sorted(result.report.ranks.items()):
        real = result.real_steps_ns.get(rank)
        real_ms = mean_measured_ns(real, skip) / 1e6 if real else None
        calibrated_ms = rc.calibrated_step_ns / 1e6 if rc.calibrated_steps_ns else None
        rows[rank] = {"uncalibrated_ms": rc.uncalibrated_step_ns / 1e6 if rc.calibrated_steps_ns else None,
                      "calibrated_ms": calibrated_ms, "real_ms": real_ms,
                      "calibrated_error": (calibrated_ms - real_ms) / real_ms
                      if calibrated_ms is not None and real_ms else None}
    return rows


def _no_steps(result: CalibrateResult) -> list[int]:
    return [r for r, rc in sorted(result.report.ranks.items()) if not rc.calibrated_steps_ns]


def _iteration_ms(result: CalibrateResult) -> tuple[float | None, float | None]:
    """(uncalibrated, calibrated) iteration time, None when no rank has steps."""
    if len(_no_steps(result)) == len(result.report.ranks):
        return None, None
    return result.report.uncalibrated_iteration_ns / 1e6, result.report.iteration_ns / 1e6


def _cell(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def print_result(result: CalibrateResult, console: Console) -> None:
    table = Table(title=f"calibrate: {len(result.slices)} slices on graph/{result.structure}, first "
                        f"{result.report.skip_steps} step(s) skipped, takes merged by {result.merge} "
                        f"({result.wall_s:.0f} s)", title_justify="left")
    for col in ("rank", "uncalibrated ms", "calibrated ms", "real run ms", "error vs real"):
        table.add_column(col, justify="right")
    for rank, row in result_rows(result).items():
        err = row["calibrated_error"]
        table.add_row(str(rank), _cell(row["uncalibrated_ms"]), _cell(row["calibrated_ms"]), _cell(row["real_ms"]),
                      _cell(None if err is None else err * 100, "{:+.2f} %"))
    console.print(table)
    uncalibrated, calibrated = _iteration_ms(result)
    if calibrated is not None:
        console.print(f"iteration time: {uncalibrated:.2f} ms uncalibrated → {calibrated:.2f} ms calibrated; "
                      f"timed graph: {result.timed_dir}")
    else:
        console.print(f"timed graph: {result.timed_dir}")
    print_no_steps(_no_steps(result), console)
    print_host_speed([("across the takes", result.host_probe_ms)], console)
    if result.real_timed_with_tracker:
        print_tracked_recording(console)


def run(args: argparse.Namespace) -> int:
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("takes"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("calibrate", total=None)

        def on_slice(done: int, total: int, ranks: tuple[int, ...]) -> None:
            desc = f"slice ranks {','.join(map(str, ranks))}" if ranks else "calibrate"
            progress.update(task, completed=done, total=total, description=desc)

        result = calibrate_run(args.run_dir, slice_size=args.slice_size, skip_steps=args.skip, repeats=args.repeats,
                               timeout_s=args.timeout, on_slice=on_slice, device=device_options(args),
                               merge=args.merge)
    print_result(result, console)
    if args.json_out:
        uncalibrated, calibrated = _iteration_ms(result)
        with open(args.json_out, "w") as f:
            f.write(dumps_strict({"ranks": result_rows(result), "iteration_ms": calibrated,
                                  "uncalibrated_iteration_ms": uncalibrated, "ranks_without_steps": _no_steps(result),
                                  "host_probe_ms": list(result.host_probe_ms), "merge": result.merge}, indent=2))
    return 0
