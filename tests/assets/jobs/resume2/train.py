"""Two ranks that train, checkpoint at the end and resume from the latest checkpoint when they find
one (like most real training scripts). Resuming takes another path: a broadcast of the loaded
weights and other losses."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt_dir = os.environ.get("CKPT_DIR", "checkpoints")
found = sorted(f for f in os.listdir(ckpt_dir) if f.startswith("step-")) if os.path.isdir(ckpt_dir) else []
w = torch.nn.Parameter(torch.full((int(os.environ.get("NUMEL", "4")),), float(rank + 1)))
opt = torch.optim.SGD([w], lr=0.1)
start = 0
if found:
    state = torch.load(os.path.join(ckpt_dir, found[-1]))
    start = state["step"]
    with torch.no_grad():
        w.copy_(state["w"])
    dist.broadcast(w.data, 0)
for step in range(start, start + 3):
    loss = (w * w).sum()
    loss.backward()
    dist.all_reduce(w.grad)
    opt.step()
    opt.zero_grad()
dist.barrier()
if rank == 0:
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.save({"w": w.detach().clone(), "step": start + 3}, os.path.join(ckpt_dir, f"step-{start + 3:04d}.pt"))
with open(f"train-rank{rank}.log", "a") as f:
    f.write(f"started at step {start}\n")
if os.environ.get("WRITE_OUTSIDE") and rank == 0:
    with open(os.environ["WRITE_OUTSIDE"], "a") as f:
        f.write("written by the script\n")
dist.barrier()
dist.destroy_process_group()
