"""Two ranks; each step an all-reduce, an all-gather and a reduce-scatter of small integer-valued
tensors, and a loss that sums their results (exact in float32). ``PAIR_OFFSET=K`` adds K to this
rank's inputs (a change applied to a sandbox rank only)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
offset = float(os.environ.get("PAIR_OFFSET", "0"))
w = torch.nn.Parameter(torch.ones(()))
opt = torch.optim.SGD([w], lr=0.0)
for step in range(3):
    x = torch.arange(8, dtype=torch.float32) + 10 * rank + step + offset
    reduced = x.clone()
    dist.all_reduce(reduced)
    gathered = torch.empty(16)
    dist.all_gather_into_tensor(gathered, x)
    scattered = torch.empty(4)
    dist.reduce_scatter_tensor(scattered, x)
    loss = w * (reduced.sum() + gathered.sum() + scattered.sum())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
