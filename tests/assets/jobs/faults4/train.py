"""The fault-injection job (bench/faults.py): W ranks, per step a sleep, an all-reduce of a
gradient, an SGD step. It prints ``step N`` after each step so the bench can inject a fault
mid-run. ``FAULT_RAISE=R:S`` in the environment: rank R raises at step S (the "rank that raises"
case; an environment variable so that one recorded run serves record, collect and emulate).

A plain PyTorch program; it knows nothing about prism.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--sleep-ms", type=float, default=100.0)
p.add_argument("--numel", type=int, default=1024)
args = p.parse_args()
raise_rank, raise_step = (int(x) for x in os.environ.get("FAULT_RAISE", "-1:-1").split(":"))

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.full((args.numel,), float(rank + 1)))
opt = torch.optim.SGD([w], lr=0.01)
for step in range(args.steps):
    if rank == raise_rank and step == raise_step:
        raise RuntimeError(f"injected failure in rank {rank} at step {step}")
    time.sleep(args.sleep_ms / 1000)
    loss = (w * w).sum()
    loss.backward()
    dist.all_reduce(w.grad)
    opt.step()
    opt.zero_grad()
    print(f"step {step}", flush=True)
dist.barrier()
dist.destroy_process_group()
