#!/usr/bin/env python3
"""Collection wall time at W=32 on K=2 slots vs the real W=32 run (prism record), as JSON.

    python bench/collect_w32.py [--example ddp] [--world 32] [--slots 2] [--out DIR]
    python bench/collect_w32.py --fork-server both --repeats 2 --json-out FILE

The example's job is scaled to W ranks along DP. Both runs check the bare graph against the real
one op for op; the JSON carries wall times, context switches, and the comm-sequence match ratio.
``--fork-server both`` runs the pair with ranks started from a fork server (the default for CPU
jobs, prism/core/forkserver.py) and afresh (``PRISM_FORK_SERVER=0``), alternated, ``--repeats``
times each, and reports the median wall times of each side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import statistics
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


def measure(job, world: int, slots: int, run: Path, skip_real: bool) -> dict:
    out: dict = {}
    real = None
    if not skip_real:
        t0 = time.monotonic()
        real = record_job(job, run, timeout_s=3600)
        out["real_wall_s"] = round(time.monotonic() - t0, 2)
    result = collect_job(job, run, CollectOptions(slots=slots, timeout_s=7200))
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
                  for r in range(world)]
        out["comm_sequence_match"] = min(ratios)
        worst = 0.0
        for r in range(world):
            for g, w in zip(result.graph.summaries[r].losses, real.summaries[r].losses, strict=True):
                worst = max(worst, abs(g - w) / max(abs(w), 1e-12))
        out["max_rel_loss_diff"] = worst
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", default="ddp")
    ap.add_argument("--world", type=int, default=32)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    ap.add_argument("--skip-real", action="store_true", help="collect only")
    ap.add_argument("--fork-server", choices=["default", "both"], default="default",
                    help="both: with and without the fork server, alternated")
    ap.add_argument("--repeats", type=int, default=1, help="with --fork-server both: runs of each side")
    ap.add_argument("--json-out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    job = scaled_job(args.example, args.world, args.slots)
    run = Path(args.out or tempfile.mkdtemp(prefix=f"prism-bench-{args.example}-w{args.world}-"))
    out: dict = {"example": args.example, "world_size": args.world, "slots": args.slots, "run_dir": str(run),
                 "host_cpus": os.cpu_count()}
    if args.fork_server == "default":
        out.update(measure(job, args.world, args.slots, run, args.skip_real))
    else:
        sides: dict[str, list[dict]] = {"fork_server": [], "fresh": []}
        for i in range(args.repeats):
            for side in (("fresh", "fork_server") if i % 2 else ("fork_server", "fresh")):
                os.environ["PRISM_FORK_SERVER"] = "1" if side == "fork_server" else "0"
                shutil.rmtree(run, ignore_errors=True)
                sides[side].append(measure(job, args.world, args.slots, run, args.skip_real))
        os.environ.pop("PRISM_FORK_SERVER")
        out["runs"] = sides
        for key in ("real_wall_s", "collect_wall_s"):
            if key in sides["fresh"][0]:
                med = {s: statistics.median(r[key] for r in runs) for s, runs in sides.items()}
                out[f"median_{key}"] = med
                out[f"{key}_fresh_over_fork_server"] = round(med["fresh"] / med["fork_server"], 2)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
