"""Two ranks, a few all_reduces and an SGD step per iteration (the smallest real job)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.full((4,), float(rank + 1)))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    loss = (w * w).sum()
    loss.backward()
    dist.all_reduce(w.grad)
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
