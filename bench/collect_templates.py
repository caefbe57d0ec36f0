#!/usr/bin/env python3
"""DP-templated collection of the hybrid example at W=64 (pp=2 x dp=8 x tp=4), as JSON.

    python bench/collect_templates.py [--pp 2 --dp 8 --tp 4] [--steps 2] [--slots 2] [--out DIR]
                                      [--json bench/results/collect_templates.json] [--compare-full]

Only DP replica 0 runs (W/dp ranks on K slots); the bare graph's manifest maps all W ranks. The
JSON carries the wall time, the ranks that ran, the ranks the manifest maps, the stored and
expanded graph sizes, and whether the expanded graph validates.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prism.coordinator import CollectOptions, collect_job  # noqa: E402
from prism.core.config import Parallelism, load_job  # noqa: E402
from prism.graph.compare import compare_comm_sequences  # noqa: E402
from prism.graph.io import read_graph  # noqa: E402
from prism.graph.validate import validate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--out", default="", help="run directory (default: a temporary one)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    parser.add_argument("--compare-full", action="store_true",
                        help="also collect every rank (templates: none) and compare each rank's expanded graph with it")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    job = load_job(ROOT / "examples/hybrid/job-templates.yaml")
    world = args.pp * args.dp * args.tp
    job = dataclasses.replace(
        job, name=f"hybrid-w{world}", world_size=world, slots=args.slots,
        args=("--steps", str(args.steps), "--pp", str(args.pp), "--dp", str(args.dp), "--tp", str(args.tp)),
        parallelism=Parallelism(pp=args.pp, dp=args.dp, tp=args.tp))
    out = Path(args.out or tempfile.mkdtemp(prefix="prism-templates-"))
    started = time.monotonic()
    result = collect_job(job, out, CollectOptions(timeout_s=1800))
    wall_s = time.monotonic() - started
    bare = out / "graph" / "bare"
    stored = read_graph(bare, expand=False)
    t0 = time.monotonic()
    expanded = read_graph(bare)
    read_s = time.monotonic() - t0
    figures = {
        "job": job.name, "world_size": job.world_size, "slots": result.num_slots,
        "parallelism": {"pp": job.parallelism.pp, "dp": job.parallelism.dp, "tp": job.parallelism.tp},
        "collect_wall_s": round(wall_s, 1), "num_ranks_run": result.num_ranks_run,
        "manifest_ranks": len(stored.templates.template_of), "rank_files": len(stored.nodes),
        "stored_bytes": sum(p.stat().st_size for p in bare.iterdir()),
        "expanded_ranks": len(expanded.nodes), "expanded_nodes": sum(len(n) for n in expanded.nodes.values()),
        "read_and_expand_s": round(read_s, 2), "num_context_switches": result.num_context_switches,
        "num_by_rule": result.num_by_rule, "violations": len(validate(expanded)),
    }
    if args.compare_full:
        started = time.monotonic()
        full = collect_job(dataclasses.replace(job, templates="none"), out / "full", CollectOptions(timeout_s=3600))
        figures["full_collect_wall_s"] = round(time.monotonic() - started, 1)
        figures["ranks_equal_to_full_collection"] = sum(
            compare_comm_sequences(r, full.graph.nodes[r], full.graph.groups, expanded.nodes[r], expanded.groups) is None
            and [n.kind for n in full.graph.nodes[r]] == [n.kind for n in expanded.nodes[r]]
            and [n.group_id for n in full.graph.nodes[r]] == [n.group_id for n in expanded.nodes[r]]
            for r in range(job.world_size))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
