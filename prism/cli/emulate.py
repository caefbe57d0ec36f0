"""Run the chosen ranks of a recorded/collected job for real; every other rank is a virtual rank
played by a replayer (pruned collectives with compensated chunks, docs/virtual-ranks.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prism.core.ranks import parse_rank_ranges
from prism.core.rundir import RunDir
from prism.core.strict_json import dumps_strict
from prism.core.units import parse_bytes
from prism.core.whatif import SandboxChange, parse_args_text, parse_env_items
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.emulate_report import emulate_and_report

from . import EXIT_OOM, add_timeout_argument, positive_int
from .devices import add_device_arguments, device_options
from .report import print_host_speed, print_no_steps, print_tracked_recording, print_tracked_sandbox

HELP = "run some ranks for real, the rest as virtual ranks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory (graph + recorded data of these ranks)")
    p.add_argument("--ranks", required=True, help="sandbox ranks, e.g. 2,5 or 0-7")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="steps to run (overrides the script's --steps; at most the recorded steps)")
    p.add_argument("--replayers", type=positive_int, default=1, help="replayer processes hosting the virtual ranks")
    p.add_argument("--graph", choices=("bare", "real"), default="", help="graph the replayers walk (default: bare if present)")
    add_timeout_argument(p, default_s=600.0)
    p.add_argument("--asap", action="store_true",
                   help="vranks answer as soon as they can, even when RUN/graph/timed exists (values only)")
    p.add_argument("--memory-cap", type=parse_bytes, default=None, metavar="SIZE",
                   help="per sandbox rank memory cap, e.g. 600000 or 2GiB (0: none; default: the job's "
                        "memory_cap_bytes); a rank above it fails with torch.OutOfMemoryError, exit code 3")
    p.add_argument("--profile", action="store_true",
                   help="run the sandbox ranks under torch.profiler: RUN/emulations/<id>/profile/rank<R>.json")
    p.add_argument("--no-memory-pass", dest="memory", action="store_const", const="inline", default="pass",
                   help="CPU: track the peaks inside the timed emulation (one run instead of two, but the "
                        "tracker costs ~5 us per aten op in every step)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="what-if: set this environment variable in the sandbox ranks only (repeatable)")
    p.add_argument("--args", default=None, metavar="'ARGS'",
                   help="what-if: the sandbox ranks run the script with these arguments instead, one "
                        "shell-quoted string (--args='--steps 4 --fwd-ms 5')")
    p.add_argument("--entrypoint", default="", metavar="FILE",
                   help="what-if: the sandbox ranks run this script instead of the recorded one")
    p.add_argument("--baseline", action="store_true",
                   help="what-if: run the unchanged emulation first and show it beside the changed one")
    p.add_argument("--json", action="store_true", help="print report.json")
    add_device_arguments(p)


def _oom_cell(row: dict) -> str:
    oom = row["oom"]
    if not oom:
        return "stopped" if row.get("stopped") else "no"
    return f"step {oom['step']}" + (f", +{oom['requested_bytes']} B" if oom["requested_bytes"] >= 0 else "")


def _ms(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def _pct(x) -> str:
    return "—" if x is None else f"{x * 100:.1f} %"


def _mib(x) -> str:
    return "—" if x is None or x < 0 else f"{x / 2**20:.2f} MiB"


def whatif_table(data: dict, change: str) -> Table:
    """Per sandbox rank: the recorded run, the unchanged emulation (``--baseline``) and this one."""
    table = Table(title=f"what-if: {escape(change)} on ranks {data['sandbox_ranks']}", title_justify="left")
    for col in ("rank", "run", "iteration ms (mean)", "vs recorded", "idle", "peak memory (measured)"):
        table.add_column(col, justify="left" if col == "run" else "right")
    this = "emulated, changed" if "change" in data else "emulated"
    for r, row in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
        rec = data.get("recorded", {}).get(r, {})
        views = [("recorded", rec), ("emulated, unchanged", data.get("baseline", {}).get(r)), (this, row)]
        for name, v in views:
            if not v:
                continue
            mean, ref = v.get("mean_ms"), rec.get("mean_ms")
            diff = f"{(mean - ref) / ref * 100:+.1f} %" if mean is not None and ref and v is not rec else ""
            table.add_row(r, name, _ms(mean), diff, _pct(v.get("idle_fraction")),
                          _mib(v.get("measured_peak_memory_bytes")))
    return table


def run(args: argparse.Namespace) -> int:
    world = RunDir(Path(args.run_dir)).load_job().world_size
    change = SandboxChange(env=parse_env_items(args.env),
                           args=parse_args_text(args.args, "--args") if args.args is not None else None,
                           entrypoint=str(Path(args.entrypoint).resolve()) if args.entrypoint else "")
    options = EmulateOptions(ranks=parse_rank_ranges(args.ranks, world), steps=args.steps,
                             num_replayers=args.replayers, graph_kind=args.graph, timeout_s=args.timeout,
                             memory_cap_bytes=args.memory_cap, profile=args.profile, memory=args.memory,
                             change=change, **device_options(args))
    report = emulate_and_report(args.run_dir, options, use_timed=not args.asap, baseline=args.baseline)
    data = report.data
    code = EXIT_OOM if "failed" in data else 0
    if args.json:
        print(dumps_strict(data, indent=2))
        return code
    table = Table(title=f"emulated W={world} with ranks {args.ranks} real, vranks {data['clock']} "
                        f"({data.get('wall_s', 0):.1f} s), first {data['skip_steps']} step(s) skipped",
                  title_justify="left")
    for col in ("rank", "iteration ms (mean)", "p50 ms", "calibrated prediction ms", "error",
                "peak memory (measured / run)", "OOM", "diverged ops", "losses per step"):
        table.add_column(col, justify="left" if col == "losses per step" else "right")
    for r, row in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
        mean, pred = row.get("mean_ms"), row.get("predicted_mean_ms")
        err = f"{(mean - pred) / pred * 100:+.2f} %" if mean is not None and pred else "—"
        mem = " / ".join(f"{b / 2**20:.2f} MiB" if b >= 0 else "—" for b in
                         (row.get("measured_peak_memory_bytes", -1), row.get("peak_memory_bytes", -1)))
        table.add_row(r, _ms(mean), _ms(row.get("p50_ms")), _ms(pred), err,
                      mem, _oom_cell(row),
                      str(len(row.get("diverged_ops", []))), " ".join("—" if x != x else f"{x:.6f}" for x in row.get("losses", [])))
    console = Console()
    console.print(table)
    if "change" in data or "baseline" in data or "recorded" in data:
        console.print(whatif_table(data, change.summary()))
    for r, row in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
        if row["oom"]:
            console.print(f"[bold red]rank {r} ran out of memory[/] at step {row['oom']['step']}: "
                          f"{escape(row['oom']['message'])}", highlight=False)
    extra = (", gantt.png" if (report.out_dir / "gantt.png").is_file() else "") + (
        ", profile/" if "profile_dir" in data else "")
    print_host_speed([("during the calibration", data.get("calibration_host_probe_ms", [])),
                      ("at this emulation", [data["host_probe_ms"]])], console)
    if data.get("recorded_timed_with_tracker"):
        print_tracked_recording(console)
    if data.get("sandbox_timed_with_tracker"):
        print_tracked_sandbox(console)
    console.print(f"outputs: {report.out_dir} (report.json, timeline.json{extra})")
    print_no_steps([int(r) for r, row in sorted(data["ranks"].items(), key=lambda kv: int(kv[0]))
                    if not row.get("step_ms") and not row["oom"]], console)
    return code
