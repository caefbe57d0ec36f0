"""DDP example: a small MLP wrapped in DistributedDataParallel, trained with SGD.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("ddp")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    # ~16 KiB per bucket: the model below has ~67 KB of parameters, so several buckets.
    p.add_argument("--bucket-cap-mb", type=float, default=0.016)
    return p.parse_args()


def setup(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    dist.init_process_group(backend=backend)
    if rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    return rank, world, device


class MLP(nn.Module):
    def __init__(self, dim, hidden, layers):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    args = parse_args()
    rank, world, device = setup(args)

    torch.manual_seed(1234)  # identical init on every rank
    model = MLP(args.dim, args.hidden, args.layers).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    # Drawn on the device, as a prefetching loader would deliver it: a step is the device's work.
    gen = torch.Generator(device=device).manual_seed(1000 + rank)  # per-rank data
    for step in range(args.steps):
        x = torch.randn(args.batch, args.dim, generator=gen, device=device)
        y = torch.randn(args.batch, 1, generator=gen, device=device)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f", step, loss.item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
