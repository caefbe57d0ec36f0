"""Run the chosen ranks of a recorded/collected job for real; every other rank is a virtual rank
played by a replayer (pruned collectives with compensated chunks, docs/virtual-ranks.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.ranks import parse_rank_ranges
from prism.core.rundir import RunDir
from prism.vrank_replayer import EmulateOptions, emulate

HELP = "run some ranks for real, the rest as virtual ranks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory (graph + recorded data of these ranks)")
    p.add_argument("--ranks", required=True, help="sandbox ranks, e.g. 2,5 or 0-7")
    p.add_argument("--steps", type=int, default=None, help="steps to run (overrides the script's --steps)")
    p.add_argument("--replayers", type=int, default=1, help="replayer processes hosting the virtual ranks")
    p.add_argument("--graph", choices=("bare", "real"), default="", help="graph the replayers walk (default: bare if present)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    world = RunDir(Path(args.run_dir)).load_job().world_size
    options = EmulateOptions(ranks=parse_rank_ranges(args.ranks, world), steps=args.steps,
                             num_replayers=args.replayers, graph_kind=args.graph, timeout_s=args.timeout)
    result = emulate(args.run_dir, options)
    if args.json:
        print(json.dumps({
            "world_size": result.world_size, "wall_s": result.wall_s, "out_dir": str(result.out_dir),
            "ranks": {r: {"losses": list(v.losses), "num_ops": v.num_ops, "diverged_ops": list(v.diverged_ops),
                          "step_times_ns": list(v.step_times_ns)} for r, v in result.ranks.items()},
            "replayers": [{"num_ops": p.num_ops, "num_transports": p.num_transports,
                           "peak_rss_bytes": p.peak_rss_bytes} for p in result.replayers],
        }, indent=2))
        return 0
    table = Table(title=f"emulated W={result.world_size} with ranks {args.ranks} real ({result.wall_s:.1f} s, "
                        f"graph/{result.graph_kind})")
    for col in ("rank", "losses per step", "ops", "diverged ops", "transports", "step ms (mean)"):
        table.add_column(col, justify="right" if col != "losses per step" else "left")
    for r, v in sorted(result.ranks.items()):
        mean_ms = sum(v.step_times_ns) / len(v.step_times_ns) / 1e6 if v.step_times_ns else float("nan")
        table.add_row(str(r), " ".join(f"{x:.6f}" for x in v.losses), str(v.num_ops), str(len(v.diverged_ops)),
                      str(v.num_transports), f"{mean_ms:.1f}")
    console = Console()
    console.print(table)
    for p in result.replayers:
        console.print(f"replayer {p.index}: {p.num_ops} ops on {p.num_channels} channels, {p.num_transports} "
                      f"transports, peak RSS {p.peak_rss_bytes / 2**20:.0f} MiB")
    console.print(f"outputs: {result.out_dir}")
    return 0
