"""Four ranks whose values come from comm-input rules (job.yaml): each rank writes what it saw."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
seen = {}

status = torch.tensor([rank], dtype=torch.int64)
dist.broadcast(status, src=0)                                  # rule: value 7
seen["status"] = status.tolist()

scale = torch.tensor([float(rank)])
dist.all_reduce(scale)                                         # rule: value 2.5 (by call site train.py:19)
seen["scale"] = scale.tolist()

counts = torch.arange(world, dtype=torch.int64) + rank
recv_counts = torch.empty_like(counts)
dist.all_to_all_single(recv_counts, counts)                    # rule: hook (rank/seq-seeded)
seen["recv_counts"] = recv_counts.tolist()
rows = torch.empty(int(recv_counts.sum()), 2)
dist.all_to_all_single(rows, torch.ones(int(counts.sum()), 2), recv_counts.tolist(), counts.tolist())

grad = torch.full((3,), float(rank + 1))
dist.all_reduce(grad)                                          # no rule: mirror filler, world * grad
seen["grad"] = grad.tolist()

flag = torch.tensor([rank % 2], dtype=torch.int64)
dist.all_reduce(flag, op=dist.ReduceOp.MAX)                    # built-in control-flow rule: exact
seen["flag"] = flag.tolist()

with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
