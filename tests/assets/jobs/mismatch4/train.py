"""Rank $MISMATCH_RANK all-reduces 5 elements where the others all-reduce 4 (a real job hangs)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
n = 5 if rank == int(os.environ.get("MISMATCH_RANK", "-1")) else 4
dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(n))
dist.barrier()
dist.destroy_process_group()
