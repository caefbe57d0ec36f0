"""Rank 3 skips the second all_reduce: a real job would hang; collect must name rank 3.

With --no-barrier rank 3 simply finishes while the others wait (a deadlock); otherwise its barrier
meets their third all_reduce (a mismatch).
"""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for i in range(3):
    if rank == 3 and i == 1:
        continue
    dist.all_reduce(t)
if "--no-barrier" not in sys.argv:
    dist.barrier()
dist.destroy_process_group()
