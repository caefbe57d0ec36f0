"""The job of bench/op_overhead.py: each op kind at each size, timed by the rank itself.

Per (op, size): ``--warmup`` untimed and ``--iters`` timed iterations of barrier, then the op
(issue to completion, ``wait``). Sizes are the op's full buffer: all_reduce/broadcast N bytes,
all_gather output N (input N/W), reduce_scatter input N (output N/W), all_to_all N in and out,
send/recv N each way on a ring (send to rank+1, receive from rank-1; ``send_recv`` through
``batch_isend_irecv``, ``isend_irecv`` as two plain calls). ``--busy-us``: the script's thread runs
Python that long between the issue and the wait, as a layer's DTensor code does after its TP
all-reduce. Inputs are the same in every
run (recorded data must match them). Each rank writes ``<out>/rank-<R>.json``: seconds per
iteration per ``<op>/<bytes>``, and ``<op>/<bytes>/cpu``: the process's CPU seconds (all its threads:
the script's and, under prism, the comm engine's) over the same span.
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv", "isend_irecv")

p = argparse.ArgumentParser()
p.add_argument("--ops", default=",".join(OPS))
p.add_argument("--sizes", default="4096,65536,1048576,16777216", help="bytes")
p.add_argument("--iters", default="20,20,10,3", help="timed iterations per size")
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--busy-us", type=float, default=0.0,
               help="Python the script runs between its issue and its wait (DTensor's does), µs")
p.add_argument("--out", required=True)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def run(op: str, nbytes: int):
    n = nbytes // 4
    fill = float(rank + 1)
    if op == "all_reduce":
        x = torch.full((n,), fill)
        return lambda: dist.all_reduce(x, async_op=True), lambda: x.fill_(fill)
    if op == "all_gather":
        x, out = torch.full((n // world,), fill), torch.empty(n)
        return lambda: dist.all_gather_into_tensor(out, x, async_op=True), None
    if op == "reduce_scatter":
        x, out = torch.full((n,), fill), torch.empty(n // world)
        return lambda: dist.reduce_scatter_tensor(out, x, async_op=True), None
    if op == "broadcast":
        x = torch.full((n,), fill)
        return lambda: dist.broadcast(x, src=0, async_op=True), lambda: x.fill_(fill)
    if op == "all_to_all":
        x, out = torch.full((n,), fill), torch.empty(n)
        return lambda: dist.all_to_all_single(out, x, async_op=True), None
    if op == "send_recv":
        x, out = torch.full((n,), fill), torch.empty(n)

        def exchange():
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % world),
                                           dist.P2POp(dist.irecv, out, (rank - 1) % world)])
            return reqs
        return exchange, None
    if op == "isend_irecv":  # as a hand-written pipeline posts them: no batch (no coalescing manager)
        x, out = torch.full((n,), fill), torch.empty(n)
        return lambda: [dist.isend(x, (rank + 1) % world), dist.irecv(out, (rank - 1) % world)], None
    raise ValueError(f"--ops: unknown op {op!r}")


times: dict[str, list[float]] = {}
for size, iters in zip((int(s) for s in args.sizes.split(",")), (int(i) for i in args.iters.split(",")), strict=True):
    for op in args.ops.split(","):
        issue, reset = run(op, size)
        key = f"{op}/{size}"
        times[key] = []
        for it in range(args.warmup + iters):
            if reset is not None:
                reset()
            dist.barrier()
            c0, s0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
            work = issue()
            if args.busy_us:
                until = time.perf_counter() + args.busy_us / 1e6
                while time.perf_counter() < until:
                    pass
            for w in work if isinstance(work, list) else [work]:
                w.wait()
            t1, s1, c1 = time.perf_counter(), time.thread_time(), time.process_time()
            if it >= args.warmup:
                times[key].append(t1 - t0)
                times.setdefault(key + "/cpu", []).append(c1 - c0)
                times.setdefault(key + "/script_cpu", []).append(s1 - s0)
dist.destroy_process_group()
Path(args.out).mkdir(parents=True, exist_ok=True)
(Path(args.out) / f"rank-{rank}.json").write_text(json.dumps(times))
