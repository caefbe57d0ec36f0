"""Prism's own cost per collective on the script's thread, without a peer to wait for: W ranks
(1 by default) issue ``--ops`` blocking all-reduces of 4 KiB (``--kind c10d``: ``dist.all_reduce``;
``funcol``: a functional all-reduce and its ``wait_tensor``, as DTensor issues them), an SGD step
every 100 ops (the recorder's step boundary), and rank 0 writes the median µs per op of the
steps after the first to ``$OP_COST_OUT``. Run plainly (torchrun's environment) and under
``prism record`` (bench/_debug/op_cost_w1/run.sh) to compare."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

p = argparse.ArgumentParser()
p.add_argument("--ops", type=int, default=3000)
p.add_argument("--kind", choices=("c10d", "funcol"), default="c10d")
args = p.parse_args()
dist.init_process_group("gloo")
w = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([w], lr=0.0)
t = torch.ones(1024)
per_step = []
t0 = time.perf_counter()
for i in range(1, args.ops + 1):
    if args.kind == "c10d":
        dist.all_reduce(t)
    else:
        funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    if i % 100 == 0:
        now = time.perf_counter()
        per_step.append((now - t0) / 100 * 1e6)
        opt.step()
        t0 = time.perf_counter()
if dist.get_rank() == 0 and os.environ.get("OP_COST_OUT"):
    with open(os.environ["OP_COST_OUT"], "w") as f:
        json.dump({"kind": args.kind, "us_per_op": statistics.median(per_step[1:]), "steps": per_step}, f)
dist.destroy_process_group()
