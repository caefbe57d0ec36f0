"""Replay one logical rank of a recorded job alone (RankLens): the script computes for real;
each comm op completes at its recorded time (or one estimated from the other records) and, with
--values, returns the tensors the rank received in the recorded run (docs/replay.md)."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table

from prism.core.strict_json import dumps_strict
from prism.core.whatif import parse_args_text
from prism.sandbox.replaying import DEBUGPY_PORT, TIMINGS, replay_rank

from . import add_timeout_argument, non_negative_int

HELP = "replay one rank of a recorded run alone (recorded values and timing)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", default=".", help="run directory (default: the current directory)")
    p.add_argument("--rank", type=int, required=True, help="logical rank to replay")
    p.add_argument("--values", action="store_true",
                   help="restore each op's recorded outputs (needs `prism record --payloads` or a collection)")
    p.add_argument("--timing", choices=TIMINGS, default="recorded",
                   help="recorded: each op's recorded duration (estimated when it has none); estimated: every "
                        "duration estimated from the other ranks' records; none: every op completes at once")
    p.add_argument("--steps", type=non_negative_int, default=0, metavar="N", help="stop after N steps (default: run the script out)")
    p.add_argument("--graph", choices=("real", "timed"), default="real", help="records from graph/real or graph/timed")
    p.add_argument("--withhold", type=float, default=0.0, metavar="FRACTION",
                   help="withhold this fraction of the rank's recorded durations and estimate them (a check)")
    p.add_argument("--seed", type=int, default=0, help="which records --withhold picks")
    p.add_argument("--debug", nargs="?", const=DEBUGPY_PORT, type=int, default=0, metavar="PORT",
                   help=f"open a debugpy listener (default port {DEBUGPY_PORT}) and wait for a client")
    p.add_argument("--args", dest="script_args", default=None, metavar="'ARGS'",
                   help="replace the recorded job's script arguments (one shell-quoted string): a changed schedule")
    p.add_argument("--json", dest="json_out", default=None, help="also write the figures as JSON to this file")
    add_timeout_argument(p, default_s=600.0, what="the replay", stall=False)


def run(args: argparse.Namespace) -> int:
    if args.debug:
        Console(stderr=True).print(f"rank {args.rank}: waiting for a debugpy client on 127.0.0.1:{args.debug}",
                                   highlight=False)
    result = replay_rank(args.run, args.rank, values=args.values, timing=args.timing, steps=args.steps,
                         graph=args.graph, withhold=args.withhold, seed=args.seed, debug_port=args.debug,
                         timeout_s=args.timeout,
                         script_args=parse_args_text(args.script_args, "--args") if args.script_args is not None else None)
    table = Table(title=f"replay of rank {args.rank} ({args.timing} timing{', values' if args.values else ''})")
    for col in ("step", "recorded ms", "replayed ms", "loss"):
        table.add_column(col, justify="right")
    losses = result.record.summary.losses
    for i, t in enumerate(result.step_times_ns):
        rec = result.recorded_step_times_ns[i] if i < len(result.recorded_step_times_ns) else -1
        table.add_row(str(i), f"{rec / 1e6:.2f}" if rec >= 0 else "-", f"{t / 1e6:.2f}",
                      f"{losses[i]:.6g}" if i < len(losses) and not math.isnan(losses[i]) else "-")
    console = Console()
    console.print(table)
    console.print(f"mean iteration after {result.warmup_steps} warmup step(s): recorded "
                  f"{result.recorded_mean_ns / 1e6:.2f} ms, replayed {result.replayed_mean_ns / 1e6:.2f} ms "
                  f"({result.error:+.2%})", highlight=False)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(dumps_strict({"rank": args.rank, "timing": args.timing, "values": args.values,
                                  "recorded_step_times_ns": list(result.recorded_step_times_ns),
                                  "replayed_step_times_ns": list(result.step_times_ns), "losses": list(losses),
                                  "error": result.error}, indent=1))
    return 0
