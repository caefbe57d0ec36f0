"""A job whose rank 5 raises after the first collective; the others block in the second."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 5:
    raise ValueError(f"boom in rank {rank}: sum was {t[0].item():.0f}")
dist.all_reduce(t)  # never completes: rank 5 is gone
print("unreachable", os.getpid())
