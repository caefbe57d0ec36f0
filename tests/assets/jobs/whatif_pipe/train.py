"""A 2-stage 1F1B pipeline inside 2 data-parallel replicas (W=4), sleep compute, one slow replica:
the what-if acceptance job (docs/whatif.md). Rank layout: rank = replica * pp + stage, so stage 1
is ranks 1 and 3.

The changes under study: ``PIPE_STAGE_SCALE=S:F`` multiplies the compute of pipeline stage S by F
(only the ranks of stage S read it; 0.5 = twice as fast); ``PIPE_SYNC_SEND_STAGE=S``: stage S sends
with a blocking ``dist.send`` (no P2P overlap) instead of ``isend``. A plain PyTorch program.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--fwd-ms", type=float, default=10.0)
    p.add_argument("--bwd-ms", type=float, default=20.0)
    p.add_argument("--slow-replica", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--act-bytes", type=int, default=16384)
    p.add_argument("--grad-bytes", type=int, default=65536)
    return p.parse_args()


def stage_scale(stage: int) -> float:
    spec = os.environ.get("PIPE_STAGE_SCALE", "")
    if not spec:
        return 1.0
    s, f = spec.split(":")
    return float(f) if int(s) == stage else 1.0


def main():
    args = parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pp = args.pp
    dp = world // pp
    replica, stage = divmod(rank, pp)
    dp_group = None
    for s in range(pp):  # every rank creates every group, in the same order
        g = dist.new_group([d * pp + s for d in range(dp)])
        if s == stage:
            dp_group = g
    prev_rank = rank - 1 if stage > 0 else None
    next_rank = rank + 1 if stage < pp - 1 else None
    factor = stage_scale(stage) * (args.slow_factor if replica == args.slow_replica else 1.0)
    fwd_s, bwd_s = args.fwd_ms * factor / 1e3, args.bwd_ms * factor / 1e3

    numel = args.act_bytes // 4
    act_out, grad_out = torch.full((numel,), float(rank)), torch.full((numel,), -float(rank))
    act_in, grad_in = torch.empty(numel), torch.empty(numel)
    torch.manual_seed(1234)
    weight = torch.nn.Parameter(torch.randn(8))
    opt = torch.optim.SGD([weight], lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    pending = []
    sync_send = os.environ.get("PIPE_SYNC_SEND_STAGE", "") == str(stage)

    def send(t, dst):
        if sync_send:
            dist.send(t, dst=dst)
        else:
            pending.append(dist.isend(t, dst=dst))

    def forward():
        if prev_rank is not None:
            dist.irecv(act_in, src=prev_rank).wait()
        time.sleep(fwd_s)
        if next_rank is not None:
            send(act_out, next_rank)

    def backward():
        if next_rank is not None:
            dist.irecv(grad_in, src=next_rank).wait()
        time.sleep(bwd_s)
        if prev_rank is not None:
            send(grad_out, prev_rank)

    M = args.microbatches
    dist.barrier()
    for _ in range(args.steps):
        warmup = min(pp - stage - 1, M)
        for _ in range(warmup):
            forward()
        for _ in range(M - warmup):
            forward()
            backward()
        for _ in range(M - warmup, M):
            backward()
        for w in pending:
            w.wait()
        pending.clear()
        loss = ((weight * torch.randn(8, generator=gen)).sum() - 1.0) ** 2
        loss.backward()
        flat = torch.zeros(args.grad_bytes // 4)
        flat[:8] = weight.grad
        dist.all_reduce(flat, group=dp_group)
        weight.grad.copy_(flat[:8] / dp)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
