"""What a Python helper thread of the sandbox pays for the GIL while the script computes in Python.

The ``live`` engine runs each op's ring steps on a channel thread, in Python, between gloo calls
(which release the GIL); the real backend's threads run none. While the script's thread runs
Python (a forward pass of small modules, an optimizer loop), the helper gets the GIL back only
when CPython's switch interval forces the script to drop it (5 ms by default). Two processes over
one ProcessGroupGloo: in process 0 a helper thread runs ``--steps`` ring steps (send + recv of
``--bytes`` to/from process 1, then a small torch op, as a pruned ring step does), while its main
thread is idle or spins in Python; process 1 only answers. Reported: the helper's median µs per
step, per switch interval.

    python bench/gil_handoff.py                 # JSON to bench/results/gil_handoff.json

Finding (2-core host at load 24, bench/results/gil_handoff.json): 57 µs per 4 KiB step whether
the main thread spins or not, at 5 ms and at 0.2 ms: a released-and-retaken GIL around a gloo
wait is not where the sandbox's per-op time goes, so the ``live`` engine keeps CPython's default
switch interval (the replayer's 0.2 ms stays: it has many channel threads running Python).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent


def _pg(rank: int, port: int) -> dist.ProcessGroupGloo:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    return dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))


def _peer(port: int, total_steps: int, numel: int) -> None:
    torch.set_num_threads(1)
    pg = _pg(1, port)
    buf = torch.zeros(numel)
    for _ in range(total_steps):
        pg.recv([buf], 0, 0).wait()
        pg.send([buf], 0, 1).wait()


def _ring(pg, steps: int, numel: int, out: list[float]) -> None:
    send, recv = torch.ones(numel), torch.empty(numel)
    acc = torch.zeros(numel)
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        s = pg.send([send], 1, 0)
        r = pg.recv([recv], 1, 1)
        r.wait()
        s.wait()
        acc.add_(recv)  # the step's reduction
        out.append((time.perf_counter_ns() - t0) / 1e3)


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--out", default=str(HERE / "results/gil_handoff.json"))
    ns = p.parse_args()
    torch.set_num_threads(1)
    numel = ns.bytes // 4
    cases = [(interval, busy) for interval in (5e-3, 2e-4) for busy in (False, True)]
    port = 29000 + os.getpid() % 1000
    peer = mp.get_context("spawn").Process(target=_peer, args=(port, ns.steps * len(cases), numel), daemon=True)
    peer.start()
    pg = _pg(0, port)
    rows = []
    for interval, busy in cases:
        sys.setswitchinterval(interval)
        stop = threading.Event()
        spinner = threading.Thread(target=_spin, args=(stop,), daemon=True) if busy else None
        if spinner:
            spinner.start()
        times: list[float] = []
        helper = threading.Thread(target=_ring, args=(pg, ns.steps, numel, times))
        helper.start()
        helper.join()
        stop.set()
        if spinner:
            spinner.join()
        row = {"switch_interval_s": interval, "script_busy": busy, "median_us_per_step": round(statistics.median(times), 1),
               "p90_us_per_step": round(statistics.quantiles(times, n=10)[-1], 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    peer.join(timeout=30)
    out = {"bytes": ns.bytes, "steps": ns.steps, "host_cpus": os.cpu_count(), "load_average": os.getloadavg(), "cases": rows}
    Path(ns.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
