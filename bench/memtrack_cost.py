"""The CPU memory tracker's cost per aten op (the biggest part of ``prism record``'s own cost on
CPU jobs with small ops), in one process: a small MLP's training step (forward, backward, AdamW)
timed with the thread's CPU time, without a dispatch mode, under an empty ``TorchDispatchMode``
(what any Python mode costs), and under ``StoragePeakTracker`` of this tree and, optionally, of
another prism tree (``--baseline-tree``); rounds alternate; medians. The tracked peaks must be equal.

    python bench/memtrack_cost.py --baseline-tree /tmp/base --out bench/results/memtrack_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from prism.sandbox.memtrack import StoragePeakTracker


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _tracker_of(tree: Path):
    spec = importlib.util.spec_from_file_location("baseline_memtrack", tree / "prism/sandbox/memtrack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StoragePeakTracker


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-tree", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=50, help="training steps per timing")
    p.add_argument("--out", default="")
    ns = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 16)

    def step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    with _Count() as counter:
        step()
    modes = {"none": contextlib.nullcontext, "empty_mode": _Empty, "tracker": StoragePeakTracker}
    if ns.baseline_tree:
        modes["baseline_tracker"] = _tracker_of(ns.baseline_tree.resolve())
    cpu_us: dict[str, list[float]] = {k: [] for k in modes}
    peaks: dict[str, set[int]] = {}
    for _ in range(ns.rounds):
        for name, make in modes.items():
            mode = make()
            with mode:
                t0 = time.thread_time_ns()
                for _ in range(ns.steps):
                    step()
                cpu_us[name].append((time.thread_time_ns() - t0) / ns.steps / 1e3)
            if hasattr(mode, "peak_bytes"):
                peaks.setdefault(name, set()).add(mode.peak_bytes)
    med = {k: statistics.median(v) for k, v in cpu_us.items()}
    per_op = {k: (v - med["none"]) / counter.ops for k, v in med.items() if k != "none"}
    out = {"ops_per_step": counter.ops, "cpu_us_per_step": med, "added_cpu_us_per_op": per_op,
           "peaks_bytes": {k: sorted(v) for k, v in peaks.items()}}
    print(f"{counter.ops} aten ops per step; CPU µs per step: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    print("added CPU µs per op: " + ", ".join(f"{k} {v:.2f}" for k, v in per_op.items()))
    print(f"tracked peaks: {out['peaks_bytes']}")
    if len({b for v in peaks.values() for b in v}) > 1:
        print("the trackers' peaks differ", file=sys.stderr)
        return 1
    if ns.out:
        Path(ns.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
