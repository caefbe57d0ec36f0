"""Does a compute span between comm ops take longer when fewer processes are busy on the host?

pp-sleep on the 16-core host: a sandbox rank's compute per step is ~3 ms (3 %) over the real run's in
both the calibration slices (4 ranks real) and the emulation (2 ranks real), while on 2 cores the spans
agree. Each span is examples/pp's stage work: 2 ms sleeps plus dim-32 layers (Python and torch
dispatch, no real FLOPs). This runs N processes of that work with no prism and no comm at all, N in
--procs, unpinned and pinned to one CPU each (prism.core.affinity's order), and prints per config the
median over processes of: the whole forward+backward span, the time inside sleep (its overshoot
over the asked time) and the time outside sleep (the Python/torch part).

    python bench/_debug/span_probe.py --procs 1 2 4 8 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _worker(idx: int, pin: bool, seconds: float, sleep_ms: float, start_at: float, q) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from torch import nn

    torch.set_num_threads(1)
    cpu = None
    if pin:
        from prism.core.affinity import pin_rank
        cpu = pin_rank(idx, "rank")
    slept = [0.0]

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, ms):
            ctx.ms = ms
            t = time.perf_counter()
            time.sleep(ms / 1e3)
            slept[0] += time.perf_counter() - t
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            t = time.perf_counter()
            time.sleep(2 * ctx.ms / 1e3)
            slept[0] += time.perf_counter() - t
            return grad, None

    class Layer(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, 2 * dim)
            self.fc2 = nn.Linear(2 * dim, dim)

        def forward(self, x):
            x = Sleep.apply(x, sleep_ms)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    model = nn.Sequential(Layer(32), Layer(32))
    x = torch.randn(2, 32, requires_grad=True)
    spans, outside, inside = [], [], []
    while time.time() < start_at:
        time.sleep(0.001)
    end = time.perf_counter() + seconds
    asked = 2 * (sleep_ms + 2 * sleep_ms) / 1e3
    while time.perf_counter() < end:
        slept[0] = 0.0
        t = time.perf_counter()
        model(x).sum().backward()
        span = time.perf_counter() - t
        spans.append(span)
        inside.append(slept[0] - asked)
        outside.append(span - slept[0])
    skip = len(spans) // 10
    q.put({"idx": idx, "cpu": cpu, "n": len(spans),
           "span_us": statistics.median(spans[skip:]) * 1e6,
           "sleep_overshoot_us": statistics.median(inside[skip:]) * 1e6,
           "outside_sleep_us": statistics.median(outside[skip:]) * 1e6})


def run(n: int, pin: bool, seconds: float, sleep_ms: float) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=_worker, args=(i, pin, seconds, sleep_ms, start_at, q)) for i in range(n)]
    for p in procs:
        p.start()
    rows = [q.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    key = ("span_us", "sleep_overshoot_us", "outside_sleep_us")
    return {"procs": n, "pinned": pin, **{k: statistics.median(r[k] for r in rows) for k in key},
            "per_proc": sorted(rows, key=lambda r: r["idx"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    results = []
    for rnd in range(a.rounds):
        for pin in (False, True):
            for n in a.procs:
                r = run(n, pin, a.seconds, a.sleep_ms)
                r["round"] = rnd
                results.append(r)
                print(f"round {rnd} procs {n} pinned {int(pin)}: span {r['span_us']:.0f} us, sleep overshoot "
                      f"{r['sleep_overshoot_us']:.0f} us, outside sleep {r['outside_sleep_us']:.0f} us", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"cpus": len(os.sched_getaffinity(0)), "results": results}, indent=1))


if __name__ == "__main__":
    main()
