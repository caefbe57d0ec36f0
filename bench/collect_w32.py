#!/usr/bin/env python3
"""Collection wall time at W=32 on K=2 slots vs the real W=32 run (prism record), as JSON.

    python bench/collect_w32.py [--example ddp] [--world 32] [--slots 2] [--out DIR]

The example's job is scaled to W ranks along DP. Both runs check the bare graph against the real
one op for op; the JSON carries wall times, context switches, and the comm-sequence match ratio.
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
from prism.core.config import load_job  # noqa: E402
from prism.graph.compare import match_ratio  # noqa: E402
from prism.sandbox.recording import record_job  # noqa: E402


def scaled_job(example: str, world: int, slots: int):
    job = load_job(ROOT / "examples" / example / "job.yaml")
    p = job.parallelism
    if p is not None:
        per_replica = p.product // p.dp
        if world % per_replica:
            raise SystemExit(f"W={world} is not a multiple of the model-parallel size {per_replica} of {example}")
        p = dataclasses.replace(p, dp=world // per_replica)
        args = list(job.args)
        if "--dp" in args:
            args[args.index("--dp") + 1] = str(p.dp)
        job = dataclasses.replace(job, args=tuple(args))
    return dataclasses.replace(job, world_size=world, parallelism=p, slots=slots)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", default="ddp")
    ap.add_argument("--world", type=int, default=32)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    ap.add_argument("--skip-real", action="store_true", help="collect only")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    job = scaled_job(args.example, args.world, args.slots)
    run = Path(args.out or tempfile.mkdtemp(prefix=f"prism-bench-{args.example}-w{args.world}-"))
    out: dict = {"example": args.example, "world_size": args.world, "slots": args.slots, "run_dir": str(run)}
    real = None
    if not args.skip_real:
        t0 = time.monotonic()
        real = record_job(job, run, timeout_s=3600)
        out["real_wall_s"] = round(time.monotonic() - t0, 2)
    result = collect_job(job, run, CollectOptions(slots=args.slots, timeout_s=7200))
    out.update({
        "collect_wall_s": round(result.wall_s, 2),
        "num_context_switches": result.num_context_switches,
        "num_grants": result.num_grants,
        "num_collectives": result.num_collectives,
        "num_p2p": result.num_p2p,
        "max_active": result.max_active,
        "payload_bytes": result.payload_bytes,
    })
    if real is not None:
        out["collect_over_real"] = round(result.wall_s / out["real_wall_s"], 2)
        ratios = [match_ratio(real.nodes[r], real.groups, result.graph.nodes[r], result.graph.groups)
                  for r in range(args.world)]
        out["comm_sequence_match"] = min(ratios)
        worst = 0.0
        for r in range(args.world):
            for g, w in zip(result.graph.summaries[r].losses, real.summaries[r].losses, strict=True):
                worst = max(worst, abs(g - w) / max(abs(w), 1e-12))
        out["max_rel_loss_diff"] = worst
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
