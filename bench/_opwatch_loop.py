"""Bench job for bench/opwatch_overhead.py: STEPS x OPS tiny all_reduces; each rank writes its
per-op wall and process CPU time of every step (µs) to $BENCH_OUT/rank-R.json."""

import json
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
steps, ops = int(os.environ.get("BENCH_STEPS", "5")), int(os.environ.get("BENCH_OPS", "2000"))
t = torch.ones(1)
wall_us, cpu_us = [], []
for _ in range(steps):
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(ops):
        dist.all_reduce(t)
    wall_us.append((time.perf_counter() - start) / ops * 1e6)
    cpu_us.append((time.process_time() - cpu) / ops * 1e6)
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as f:
    json.dump({"wall_us": wall_us, "cpu_us": cpu_us}, f)
dist.destroy_process_group()
