"""A job whose rank 6 raises after the first collective; the others block in the second."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 6:
    raise RuntimeError(f"boom in rank {rank}: sum was {t[0].item():.0f}")
dist.all_reduce(t)
dist.destroy_process_group()
