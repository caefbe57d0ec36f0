"""Anomaly example (RankLens §V-D): DDP with 577 fp32 parameters and SGD, a NaN from one rank.

With --nan-rank R, rank R sets the first element of its first gradient bucket to NaN before the
all-reduce at step --nan-step; every rank then receives the NaN and its SGD update writes it into
one parameter. --dump DIR saves each rank's gradients (after the all-reduce) and parameters
(after the update) per step to DIR/rank-<R>.pt, for a bitwise comparison.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--nan-rank", type=int, default=-1)
    p.add_argument("--nan-step", type=int, default=0)
    p.add_argument("--dump", default="")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))  # 544 + 33 = 577 parameters
    assert sum(p.numel() for p in model.parameters()) == 577
    ddp = DDP(model)
    step_box = [0]

    def allreduce_mean(_state, bucket):
        buf = bucket.buffer()
        if rank == args.nan_rank and step_box[0] == args.nan_step and bucket.index() == 0:
            buf[0] = float("nan")
        buf.div_(world)
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, allreduce_mean)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)
    dumps = []
    for step in range(args.steps):
        step_box[0] = step
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 1, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
        opt.step()
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
        opt.zero_grad()
        dumps.append({"grad": grads, "param": params})
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        torch.save(dumps, os.path.join(args.dump, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
