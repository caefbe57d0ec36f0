"""Rank 3 skips the second all_reduce and then hangs outside any comm op; ranks 0-2 wait in it."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for i in range(3):
    if rank == 3 and i == 1:
        time.sleep(3600)
    dist.all_reduce(t)
dist.destroy_process_group()
