"""Synthetic dp x pp pipeline: the CPU timing ground truth.

Compute spans are time.sleep (so timing does not depend on how many CPU cores there are), arranged
as a hand-written 1F1B pipeline schedule: pp stages exchange activation / gradient tensors with
dist.isend / dist.irecv, and at the end of each step the dp replicas of a stage all_reduce a
"gradient" tensor. Stragglers: --slow-stage S --slow-factor F makes stage S's compute F times slower;
--slow-replica D --slow-replica-factor F2 does the same for dp replica D (the two multiply).
A tiny real nn.Parameter, a scalar loss with .backward() and an optimizer keep the program a
normal training loop (one optimizer.step() per iteration).

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
Rank layout: rank = stage * dp + replica (the ("pp", "dp") mesh order).
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist

log = logging.getLogger("synthetic")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--dp", type=int, default=0, help="default: WORLD_SIZE / pp")
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--fwd-ms", type=float, default=10.0, help="forward time per microbatch per stage")
    p.add_argument("--bwd-ms", type=float, default=20.0, help="backward time per microbatch per stage")
    p.add_argument("--slow-stage", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--slow-replica", type=int, default=-1)
    p.add_argument("--slow-replica-factor", type=float, default=1.0)
    p.add_argument("--act-bytes", type=int, default=16384, help="activation / activation-grad message size")
    p.add_argument("--grad-bytes", type=int, default=262144, help="dp gradient all_reduce size")
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


def main():
    args = parse_args()
    rank, world, device = setup(args)
    pp = args.pp
    dp = args.dp or world // pp
    assert dp * pp == world, f"dp*pp = {dp}*{pp} != WORLD_SIZE {world}"
    stage, replica = rank // dp, rank % dp
    M = args.microbatches

    # dp groups (one per stage); every rank creates every group, in the same order.
    dp_group = None
    for s in range(pp):
        g = dist.new_group([s * dp + d for d in range(dp)])
        if s == stage:
            dp_group = g
    prev_rank = (stage - 1) * dp + replica if stage > 0 else None
    next_rank = (stage + 1) * dp + replica if stage < pp - 1 else None

    factor = 1.0
    if stage == args.slow_stage:
        factor *= args.slow_factor
    if replica == args.slow_replica:
        factor *= args.slow_replica_factor
    fwd_s = args.fwd_ms * factor / 1000.0
    bwd_s = args.bwd_ms * factor / 1000.0

    act_numel = max(1, args.act_bytes // 4)
    grad_numel = max(1, args.grad_bytes // 4)
    act_out = torch.full((act_numel,), float(rank), device=device)     # what this stage sends forward
    grad_out = torch.full((act_numel,), -float(rank), device=device)   # what it sends backward
    act_in = torch.empty(act_numel, device=device)
    grad_in = torch.empty(act_numel, device=device)

    torch.manual_seed(1234)  # identical init on every rank
    weight = torch.nn.Parameter(torch.randn(8, device=device))
    opt = torch.optim.SGD([weight], lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)

    pending = []  # outstanding isend works; a recv is always posted before it is needed

    def forward(mb):
        if prev_rank is not None:
            dist.irecv(act_in, src=prev_rank).wait()
        time.sleep(fwd_s)
        if next_rank is not None:
            pending.append(dist.isend(act_out, dst=next_rank))

    def backward(mb):
        if next_rank is not None:
            dist.irecv(grad_in, src=next_rank).wait()
        time.sleep(bwd_s)
        if prev_rank is not None:
            pending.append(dist.isend(grad_out, dst=prev_rank))

    dist.barrier()  # start the first step together (ranks come up at different times)
    for step in range(args.steps):
        t0 = time.perf_counter()
        # 1F1B (PipeDream-flush): warm-up forwards, steady 1F1B, cool-down backwards.
        warmup = min(pp - stage - 1, M)
        for mb in range(warmup):
            forward(mb)
        for i in range(M - warmup):
            forward(warmup + i)
            backward(i)
        for mb in range(M - warmup, M):
            backward(mb)
        for w in pending:
            w.wait()
        pending.clear()

        # A tiny real loss and backward so the step looks like training to the framework.
        x = torch.randn(8, generator=gen).to(device)
        loss = ((weight * x).sum() - 1.0) ** 2
        loss.backward()

        # Data-parallel gradient all_reduce of --grad-bytes, carrying the real gradient in front.
        flat = torch.zeros(grad_numel, device=device)
        n = min(grad_numel, weight.numel())
        flat[:n] = weight.grad.reshape(-1)[:n]
        dist.all_reduce(flat, group=dp_group)
        weight.grad.reshape(-1)[:n].copy_(flat[:n] / dp)

        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f time %.3f s", step, loss.item(), time.perf_counter() - t0)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
