"""Overlap tuning example (RankLens §V-E): two branches, and where to wait for branch A's all-reduce.

Each step runs branch A's compute, starts the all-reduce of A's gradient (``async_op=True``), then
runs branch B's compute, which does not need A's result, and updates the parameters. By default
the script waits for A's all-reduce right after starting it (early wait: B runs after the
communication); ``--defer-wait`` moves the wait after B's compute, so B overlaps the all-reduce.
Compute is time.sleep (timing independent of the host's cores), and a tiny real parameter with SGD
keeps it a training loop.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import time

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--a-ms", type=float, default=20.0, help="branch A's compute per step")
    p.add_argument("--b-ms", type=float, default=30.0, help="branch B's compute per step")
    p.add_argument("--grad-bytes", type=int, default=16 << 20, help="branch A's all-reduce size")
    p.add_argument("--defer-wait", action="store_true", help="wait for A's all-reduce after B's compute")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    weight = torch.nn.Parameter(torch.randn(8))
    opt = torch.optim.SGD([weight], lr=0.01)
    grad_a = torch.zeros(max(1, args.grad_bytes // 4))
    for _ in range(args.steps):
        time.sleep(args.a_ms / 1000)  # branch A
        loss = ((weight * float(rank + 1)) ** 2).sum()
        loss.backward()
        grad_a[: weight.numel()] = weight.grad
        work = dist.all_reduce(grad_a, async_op=True)
        if not args.defer_wait:
            work.wait()
        time.sleep(args.b_ms / 1000)  # branch B: independent of A's reduced gradient
        if args.defer_wait:
            work.wait()
        weight.grad.copy_(grad_a[: weight.numel()] / world)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
