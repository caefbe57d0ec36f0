"""Tensor-parallel example: DTensor TP (ColwiseParallel / RowwiseParallel) on an MLP, on a 2-D
("dp", "tp") device mesh; gradients are averaged across the dp dimension by hand with one
all_reduce of a flat buffer over the dp process group.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

log = logging.getLogger("tp")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="also sleep this long in each layer's forward and twice as long in its backward "
                        "(compute whose time does not depend on the host's cores)")
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


class Sleep(torch.autograd.Function):
    """Identity that sleeps ``ms`` in forward and ``2 * ms`` in backward (``--sleep-ms``: compute whose
    time does not depend on the host's cores). On an input that needs no gradient (the first layer's
    data) autograd never calls the backward: that layer sleeps in forward only."""

    @staticmethod
    def forward(ctx, x, ms):
        ctx.ms = ms
        time.sleep(ms / 1e3)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.ms / 1e3)
        return grad, None


def sleep(x, ms):
    return Sleep.apply(x, ms) if ms > 0 else x


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, sleep_ms=0.0):
        super().__init__()
        self.sleep_ms = sleep_ms
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        x = sleep(x, self.sleep_ms)
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, dim, hidden, layers, sleep_ms=0.0):
        super().__init__()
        self.blocks = nn.ModuleList(FeedForward(dim, hidden, sleep_ms) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    args = parse_args()
    rank, world, device = setup(args)
    assert world % args.tp == 0, "WORLD_SIZE must be a multiple of --tp"
    dp = world // args.tp
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_group = mesh["dp"].get_group()
    dp_rank = mesh["dp"].get_local_rank()

    torch.manual_seed(1234)  # identical init on every rank
    model = MLP(args.dim, args.hidden, args.layers, args.sleep_ms).to(device)
    plan = {}
    for i in range(args.layers):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    # foreach=False: the head's parameters are plain tensors beside the blocks' DTensors, and the
    # foreach kernels (CUDA's default) refuse the mix.
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)

    # Data depends on the dp coordinate only: the ranks of one tp group see the same batch.
    # Drawn on the device, as a prefetching loader would deliver it: a step is the device's work.
    gen = torch.Generator(device=device).manual_seed(1000 + dp_rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.dim, generator=gen, device=device)
        y = torch.randn(args.batch, 1, generator=gen, device=device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()

        # Data-parallel gradient average: one flat all_reduce over the dp group.
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        flat /= dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f", step, loss.item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
