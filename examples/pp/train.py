"""Pipeline-parallel example: torch.distributed.pipelining with static stage shapes, Schedule1F1B or
ScheduleInterleaved1F1B (two stages per rank), pp x dp ranks; each stage's gradients are averaged
across dp replicas by hand with one all_reduce of a flat buffer over that stage's dp group.

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
The loss lives on the rank that holds the last stage, so that rank of dp replica 0 logs it.
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

log = logging.getLogger("pp")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--schedule", choices=["1f1b", "interleaved"], default="1f1b")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers-per-stage", type=int, default=2)
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="also sleep this long in each layer's forward and twice as long in its backward "
                        "(compute whose time does not depend on the host's cores)")
    p.add_argument("--slow-stage", type=int, default=-1, help="this stage runs its layers --slow-repeat times")
    p.add_argument("--slow-repeat", type=int, default=2)
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
        self.sleep_ms = sleep_ms
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        x = sleep(x, self.sleep_ms)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class Repeated(nn.Module):
    """A stage made slower: its layers applied ``times`` times (same parameters, more compute)."""

    def __init__(self, inner, times):
        super().__init__()
        self.inner, self.times = inner, times

    def forward(self, x):
        for _ in range(self.times):
            x = self.inner(x)
        return x


def main():
    args = parse_args()
    rank, world, device = setup(args)
    assert world % args.pp == 0, "WORLD_SIZE must be a multiple of --pp"
    dp = world // args.pp
    mesh = init_device_mesh(device.type, (args.pp, dp), mesh_dim_names=("pp", "dp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()

    stages_per_rank = 2 if args.schedule == "interleaved" else 1
    n_stages = args.pp * stages_per_rank
    # Rank pp_rank holds stages pp_rank, pp_rank + pp, ... (the interleaved "loop" placement).
    stage_ids = [pp_rank + i * args.pp for i in range(stages_per_rank)]

    # The whole model is built identically on every rank; each rank keeps its stages' slices.
    torch.manual_seed(1234)
    layers = [Layer(args.dim, args.sleep_ms) for _ in range(n_stages * args.layers_per_stage)]
    mb_shape = (args.microbatch_size, args.dim)
    stages, modules = [], []
    for s in stage_ids:
        mod = nn.Sequential(*layers[s * args.layers_per_stage:(s + 1) * args.layers_per_stage]).to(device)
        if s == args.slow_stage:
            mod = Repeated(mod, args.slow_repeat)
        modules.append(mod)
        stages.append(PipelineStage(
            mod, s, n_stages, device,
            # Static shapes: no run-time shape inference (send_object_list of metadata).
            # requires_grad on the examples tells the stage which activations carry gradients back.
            input_args=(torch.empty(mb_shape, device=device, requires_grad=s > 0),),
            output_args=(torch.empty(mb_shape, device=device, requires_grad=True),),
            group=pp_group,
        ))
    del layers

    def loss_fn(output, target):
        return nn.functional.mse_loss(output, target)

    if args.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=args.microbatches, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stages[0], n_microbatches=args.microbatches, loss_fn=loss_fn)

    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)

    has_first = 0 in stage_ids
    has_last = (n_stages - 1) in stage_ids
    if has_last and dp_rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(message)s")

    # Data depends on the dp coordinate only; every stage of a pipeline draws the same batch.
    # Drawn on the device, as a prefetching loader would deliver it: a step is the device's work.
    gen = torch.Generator(device=device).manual_seed(1000 + dp_rank)
    batch = args.microbatches * args.microbatch_size
    for step in range(args.steps):
        x = torch.randn(batch, args.dim, generator=gen, device=device)
        y = torch.randn(batch, args.dim, generator=gen, device=device)
        losses = []
        if has_first and has_last:
            schedule.step(x, target=y, losses=losses)
        elif has_first:
            schedule.step(x)
        elif has_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()

        if dp > 1:  # data-parallel gradient average, one flat all_reduce per rank
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            offset = 0
            for p in params:
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()

        opt.step()
        opt.zero_grad()
        if has_last and dp_rank == 0:
            log.info("step %d loss %.6f", step, torch.stack(losses).mean().item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
