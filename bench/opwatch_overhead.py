"""What the hang watcher's op publication costs per comm op (prism/sandbox/opwatch.py).

    python bench/opwatch_overhead.py [--ops 2000] [--steps 5] [--repeats 3] [--out FILE.json]

(``--repeats 0``: parts 1 and 2 only, printed, no JSON written.)

1. Script thread: ``OpPublisher.issued`` + ``completed`` (what ``PrismProcessGroup._issue`` adds to
   every op), timed in a loop. Parts 1 and 2 count the thread's CPU time (``thread_time_ns``): on a
   shared machine the wall time mostly measures the neighbours.
2. Publisher thread: ``flush`` of a batch of real recorder nodes (format the fingerprint and the
   description, one ``queue_push`` to a real TCPStore), per op, for batches of 10 and 1,000 ops.
3. End to end: ``prism record`` of a W=2 loop of 1-element all_reduces (bench/_opwatch_loop.py) with
   publication on and off (``PRISM_OPWATCH=0``), alternating; median over steps after the first,
   over ranks and repeats, of the wall time per op and of the rank's CPU time per op (all threads).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from prism.core.hangwatch import queue_key  # noqa: E402
from prism.graph.records import CommOp  # noqa: E402
from prism.sandbox.engines.base import CommRequest, GroupHandle  # noqa: E402
from prism.sandbox.opwatch import OpPublisher  # noqa: E402
from prism.sandbox.recorder import Recorder  # noqa: E402


def _nodes(n: int) -> tuple[Recorder, GroupHandle, list[int]]:
    rec = Recorder(0, 8)
    group = GroupHandle(group_id="0", ranks=tuple(range(8)), group_rank=0)
    t = torch.ones(1024)
    tokens = [rec.on_issue(CommRequest(op=CommOp.ALL_REDUCE, group=group, inputs=[t], outputs=[t], reduce_op="sum",
                                       seq=seq)) for seq in range(n)]
    return rec, group, tokens


def script_thread_ns(n: int = 200_000) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pub = OpPublisher(f"127.0.0.1:{store.port}", 0, lambda tok: {}, timeout_s=30, interval_s=3600)
    group = GroupHandle(group_id="0", ranks=(0, 1), group_rank=0)
    best = float("inf")
    for _ in range(5):
        start = time.thread_time_ns()
        for tok in range(n):
            pub.issued(tok, group)
            pub.completed(tok)
        best = min(best, (time.thread_time_ns() - start) / n)
        pub._issued.clear()
        pub._completed.clear()
    pub._stop.set()
    return best


def publisher_thread_ns(batch: int, rounds: int = 20) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    rec, group, tokens = _nodes(batch)
    pub = OpPublisher(f"127.0.0.1:{store.port}", 0, rec.comm_node, timeout_s=30,
                      interval_s=3600)
    pub.issued(tokens[0], group)
    pub.flush()  # connect
    times = []
    for _ in range(rounds):
        for tok in tokens:
            pub.issued(tok, group)
            pub.completed(tok)
        start = time.thread_time_ns()
        pub.flush()
        times.append((time.thread_time_ns() - start) / batch)
        while store.queue_len(queue_key(0)):
            store.queue_pop(queue_key(0), False)
    pub._stop.set()
    return statistics.median(times)


def record_per_op_us(on: bool, *, ops: int, steps: int) -> list[float]:
    from prism.core.config import load_job
    from prism.sandbox.recording import record_job

    work = Path(tempfile.mkdtemp(prefix="opwatch-bench-"))
    job_file = work / "job.yaml"
    job_file.write_text(f"name: opwatch-loop\nentrypoint: {ROOT / 'bench/_opwatch_loop.py'}\nworld_size: 2\n"
                        f"env: {{BENCH_OUT: '{work}', BENCH_OPS: '{ops}', BENCH_STEPS: '{steps}'}}\n")
    os.environ["PRISM_OPWATCH"] = "1" if on else "0"
    record_job(load_job(job_file), work / "run", timeout_s=600)
    per_rank = [json.loads((work / f"rank-{r}.json").read_text()) for r in range(2)]
    return {k: [x for d in per_rank for x in d[k][1:]] for k in ("wall_us", "cpu_us")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench/results/opwatch_overhead.json"))
    ns = p.parse_args()
    result = {"script_thread_ns_per_op": script_thread_ns(),
              "publisher_thread_ns_per_op": {str(b): publisher_thread_ns(b) for b in (10, 1000)}}
    print(json.dumps(result), flush=True)
    if ns.repeats == 0:  # parts 1 and 2 only
        return
    samples = {mode: {"wall_us": [], "cpu_us": []} for mode in ("off", "on")}
    for _ in range(ns.repeats):
        for mode in ("off", "on"):
            got = record_per_op_us(mode == "on", ops=ns.ops, steps=ns.steps)
            for k, v in got.items():
                samples[mode][k] += v
    med = {mode: {k: statistics.median(v) for k, v in d.items()} for mode, d in samples.items()}
    result["record_all_reduce_us_per_op"] = {
        "median": med, "delta_wall_us": med["on"]["wall_us"] - med["off"]["wall_us"],
        "delta_cpu_us": med["on"]["cpu_us"] - med["off"]["cpu_us"], "samples": samples}
    result["setup"] = {"world_size": 2, "ops_per_step": ns.ops, "steps": ns.steps, "repeats": ns.repeats,
                       "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    Path(ns.out).write_text(json.dumps(result, indent=1))
    print(f"script thread: {result['script_thread_ns_per_op']:.0f} ns/op; publisher thread: "
          + ", ".join(f"{v:.0f} ns/op in batches of {k}" for k, v in result["publisher_thread_ns_per_op"].items()))
    for k in ("wall_us", "cpu_us"):
        print(f"record, W=2 all_reduce of 1 element, {k}: {med['off'][k]:.1f} per op off, {med['on'][k]:.1f} on "
              f"({med['on'][k] - med['off'][k]:+.1f})")


if __name__ == "__main__":
    main()
