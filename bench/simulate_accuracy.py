"""prism simulate vs a real run: record the synthetic timing job (sleep compute, dp x pp with
1F1B, 8 microbatches) with `prism record`, predict every rank's iteration time from the recorded
graph, and compare with the measured time of the same steps.

    python bench/simulate_accuracy.py [--job examples/synthetic/job.yaml] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from prism.cli.simulate import simulate_run
from prism.core.config import load_job
from prism.sandbox.recording import record_job

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default=str(ROOT / "examples/synthetic/job.yaml"))
    p.add_argument("--out", default=None)
    ns = p.parse_args()
    job = load_job(ns.job)
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        record_job(job, tmp)
        result = simulate_run(tmp, "real", job.iterations.warmup)
    errors = [abs(r["rel_error"]) for r in result["ranks"].values()]
    summary = {
        "benchmark": "simulate_accuracy",
        "job": job.name,
        "world_size": job.world_size,
        "args": list(job.args),
        "median_abs_rel_error": statistics.median(errors),
        "max_abs_rel_error": max(errors),
        "max_step_rel_error": max(r["max_step_rel_error"] for r in result["ranks"].values()),
        "ranks": result["ranks"],
    }
    print(f"{'rank':>4} {'predicted ms':>13} {'measured ms':>12} {'error':>8}")
    for rank, r in result["ranks"].items():
        print(f"{rank:>4} {r['predicted_ms']:13.2f} {r['measured_ms']:12.2f} {r['rel_error'] * 100:+7.2f}%")
    print(f"median |error| {summary['median_abs_rel_error'] * 100:.2f} %, max {summary['max_abs_rel_error'] * 100:.2f} %")
    if ns.out:
        Path(ns.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
