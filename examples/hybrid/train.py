"""Hybrid 3-D example: pipeline parallelism x FSDP2 x tensor parallelism on one
init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp")).

Each rank builds its pipeline stage (a few residual MLP layers), parallelizes every layer with
DTensor TP (ColwiseParallel / RowwiseParallel over the "tp" mesh dim), shards it with FSDP2
(fully_shard over the "dp" mesh dim, per layer and on the stage root), and drives the stages with
Schedule1F1B using static stage shapes. FSDP2's reduce-scatter averages gradients over dp.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
The loss lives on the ranks that hold the last stage; its (dp 0, tp 0) rank logs it.
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

log = logging.getLogger("hybrid")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=0, help="default: WORLD_SIZE / (pp * tp)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers-per-stage", type=int, default=2)
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


class Layer(nn.Module):
    def __init__(self, dim, sleep_ms=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.sleep_ms = sleep_ms

    def forward(self, x):
        x = sleep(x, self.sleep_ms)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def main():
    args = parse_args()
    rank, world, device = setup(args)
    dp = args.dp or world // (args.pp * args.tp)
    assert args.pp * dp * args.tp == world, f"pp*dp*tp = {args.pp}*{dp}*{args.tp} != WORLD_SIZE {world}"
    mesh = init_device_mesh(device.type, (args.pp, dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank = mesh["pp"].get_local_rank()
    dp_rank = mesh["dp"].get_local_rank()
    tp_rank = mesh["tp"].get_local_rank()

    n_stages = args.pp
    # The whole model is built identically on every rank; each rank keeps its stage's layers.
    torch.manual_seed(1234)
    layers = [Layer(args.dim, args.sleep_ms) for _ in range(n_stages * args.layers_per_stage)]
    lps = args.layers_per_stage
    stage_mod = nn.Sequential(*layers[pp_rank * lps:(pp_rank + 1) * lps]).to(device)
    del layers

    # TP inside each layer, then FSDP2 over dp per layer and on the stage root.
    for layer in stage_mod:
        parallelize_module(layer, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    for layer in stage_mod:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(stage_mod, mesh=mesh["dp"])

    mb_shape = (args.microbatch_size, args.dim)
    stage = PipelineStage(
        stage_mod, pp_rank, n_stages, device,
        # Static shapes (plain tensors: TP's Rowwise output is all-reduced back to a local tensor).
        input_args=(torch.empty(mb_shape, device=device, requires_grad=pp_rank > 0),),
        output_args=(torch.empty(mb_shape, device=device, requires_grad=True),),
        group=mesh["pp"].get_group(),
    )

    def loss_fn(output, target):
        return nn.functional.mse_loss(output, target)

    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=1e-3)

    is_first, is_last = pp_rank == 0, pp_rank == n_stages - 1
    logs = is_last and dp_rank == 0 and tp_rank == 0
    if logs:
        logging.basicConfig(level=logging.INFO, format="%(message)s")

    # Data depends on the dp coordinate only (the tp ranks and stages of one pipeline agree).
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    batch = args.microbatches * args.microbatch_size
    for step in range(args.steps):
        x = torch.randn(batch, args.dim, generator=gen).to(device)
        y = torch.randn(batch, args.dim, generator=gen).to(device)
        losses = []
        if is_first and is_last:
            schedule.step(x, target=y, losses=losses)
        elif is_first:
            schedule.step(x)
        elif is_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
        if logs:
            log.info("step %d loss %.6f", step, torch.stack(losses).mean().item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
