"""A hand-written 1F1B pipeline with sleep compute and no optimizer (no optimizer.step, no backward).

Nothing marks an iteration: the program is a loop of sends and receives between neighbouring
stages with time.sleep standing in for the forward and backward of each microbatch. At start-up
stage 0 tells the others the activation size over blocking dist.send/dist.recv (a prologue that only
step 0 has), and a final barrier ends the run. Per step and microbatch: dist.recv of the activation
(blocking) before a forward, dist.irecv(...).wait() of the gradient before a backward, dist.isend of
the results (waited at the end of the step).

A plain PyTorch program (run it with torchrun); it knows nothing about prism. Rank = stage.
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist

log = logging.getLogger("pp_sleep_noopt")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--fwd-ms", type=float, default=4.0, help="forward time per microbatch per stage")
    p.add_argument("--bwd-ms", type=float, default=8.0, help="backward time per microbatch per stage")
    p.add_argument("--act-bytes", type=int, default=16384, help="activation / activation-grad message size")
    return p.parse_args()


def main():
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=args.backend or ("nccl" if args.device == "cuda" else "gloo"))
    if rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    stage, pp, M = rank, world, args.microbatches
    prev_rank = stage - 1 if stage > 0 else None
    next_rank = stage + 1 if stage < pp - 1 else None

    # Prologue: the activation size travels down the pipeline once (blocking send/recv).
    numel = torch.tensor([max(1, args.act_bytes // 4)], dtype=torch.int64, device=device)
    if prev_rank is not None:
        dist.recv(numel, src=prev_rank)
    if next_rank is not None:
        dist.send(numel, dst=next_rank)
    n = int(numel.item())
    act_out = torch.full((n,), float(rank), device=device)
    grad_out = torch.full((n,), -float(rank), device=device)
    act_in = torch.empty(n, device=device)
    grad_in = torch.empty(n, device=device)
    fwd_s, bwd_s = args.fwd_ms / 1000.0, args.bwd_ms / 1000.0
    pending = []

    def forward():
        if prev_rank is not None:
            dist.recv(act_in, src=prev_rank)
        time.sleep(fwd_s)
        if next_rank is not None:
            pending.append(dist.isend(act_out, dst=next_rank))

    def backward():
        if next_rank is not None:
            dist.irecv(grad_in, src=next_rank).wait()
        time.sleep(bwd_s)
        if prev_rank is not None:
            pending.append(dist.isend(grad_out, dst=prev_rank))

    for step in range(args.steps):
        t0 = time.perf_counter()
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
        if rank == 0:
            log.info("step %d time %.3f s", step, time.perf_counter() - t0)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
