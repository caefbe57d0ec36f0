"""examples/synthetic at short steps (sleep compute: 4 microbatches of 1 ms forward and 2 ms
backward per stage, pp 2 × dp 2, W=4, ~23 ms steps, 64 KiB gradient all-reduce) through
``bench/emulate_fidelity.py --examples``'s machinery, on the CPU data path given: ``host`` (the
sandbox rank runs the pruned ring steps) or ``lanes`` (each op delegated to the replayer). Sleep
compute keeps the 2-core host's contention out of the compute; what differs between the paths is
the emulator's own cost per op (``emulated_vs_calibrated`` in the JSON).

    PYTHONPATH=.:bench python bench/_debug/short_synthetic_paths.py --paths lanes,host --rounds 2 --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _examples_fidelity as ef  # noqa: E402

ARGS = ("--pp", "2", "--microbatches", "4", "--fwd-ms", "1", "--bwd-ms", "2", "--grad-bytes", "65536")


_example_job = ef.example_job


def _short_job(name: str, size: str, world: int | None = None):
    job = _example_job(name, size, None)
    return dataclasses.replace(job, world_size=4, ranks_per_node=4,
                               parallelism=dataclasses.replace(job.parallelism, dp=2, pp=2))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="lanes,host")
    p.add_argument("--rounds", type=int, default=2, help="each path once per round, alternated")
    p.add_argument("--out", required=True, help="directory for one JSON per (path, round)")
    ns = p.parse_args()
    ef.EXAMPLES["synthetic"] = ("examples/synthetic/job.yaml", ARGS, (1, 2))  # as its "long" size
    ef.example_job = _short_job  # run_example builds the job through the module's name
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(1, ns.rounds + 1):
        for path in ns.paths.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                ef.run_all(["synthetic"], ["long"], Path(tmp), out / f"short_synthetic_{path}_{i}.json", budget_s=1e9,
                           first_job_s=60, ranks=None, repeats=3, real_repeats=3, slice_size=2, calibration_repeats=1,
                           timeout_s=300, order="alternate", device_path=path, world=4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
