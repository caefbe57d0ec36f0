"""DDP example: a small MLP wrapped in DistributedDataParallel, trained with SGD.

Four config knobs (PrismLLM Table 1's what-ifs, docs/whatif.md), off by default; each a flag or an
environment variable (the variable is read when the flag is absent, so one rank can differ):

* ``--recompute`` / ``DDP_RECOMPUTE=1``: activation recomputation, torch.utils.checkpoint on every
  Linear-GELU-Linear block (non-reentrant);
* ``--offload-activations`` / ``DDP_OFFLOAD_ACTIVATIONS=1``: the tensors autograd saves go to host
  memory in the forward and come back in the backward (``saved_tensors_hooks``; on CUDA
  ``save_on_cpu(pin_memory=True)``, on a CPU job a NumPy copy: host memory outside the torch
  allocator, which plays the device here);
* ``--offload-optimizer`` / ``DDP_OFFLOAD_OPTIMIZER=1``: the optimizer state (SGD's momentum
  buffers) lives in host memory and the update runs there, ZeRO-Offload style (on CUDA: pinned host
  buffers, the gradient copied down and the updated parameter copied back; on a CPU job: NumPy
  memory outside the torch allocator, updated in place by the same arithmetic as ``torch.optim.SGD``,
  so the values are bitwise those of the plain run);
* ``--matmul float64`` / ``DDP_MATMUL=float64``: another compute path, every Linear computed in
  float64 (inputs and weights cast up, the output cast back to float32).

``DDP_KNOB_RANKS=1,3``: the environment knobs apply on these ranks only (a per-rank change).

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import contextlib
import logging
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("ddp")


def knob_env():
    """The environment knobs, unless ``DDP_KNOB_RANKS`` leaves this rank out."""
    ranks = os.environ.get("DDP_KNOB_RANKS", "")
    if ranks and os.environ.get("RANK") not in ranks.split(","):
        return {}
    return os.environ


def parse_args():
    env = knob_env()
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="also sleep this long in each layer's forward and twice as long in its backward "
                        "(compute whose time does not depend on the host's cores)")
    # ~16 KiB per bucket: the model below has ~67 KB of parameters, so several buckets.
    p.add_argument("--bucket-cap-mb", type=float, default=0.016)
    p.add_argument("--recompute", action="store_true", default=env.get("DDP_RECOMPUTE") == "1")
    p.add_argument("--offload-activations", action="store_true",
                   default=env.get("DDP_OFFLOAD_ACTIVATIONS") == "1")
    p.add_argument("--offload-optimizer", action="store_true",
                   default=env.get("DDP_OFFLOAD_OPTIMIZER") == "1")
    p.add_argument("--matmul", choices=["float32", "float64"], default=env.get("DDP_MATMUL", "float32"))
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


def linear64(x, layer):
    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x.double(), layer.weight.double(), bias).to(x.dtype)


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


class MLP(nn.Module):
    def __init__(self, dim, hidden, layers, recompute=False, matmul="float32", sleep_ms=0.0):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(dim, 1)
        self.recompute = recompute
        self.matmul = matmul
        self.sleep_ms = sleep_ms

    def block(self, i, x):
        up, act, down = self.body[i:i + 3]
        x = sleep(x, self.sleep_ms)
        if self.matmul == "float64":
            return linear64(act(linear64(x, up)), down)
        return down(act(up(x)))

    def forward(self, x):
        if not self.recompute and self.matmul == "float32" and not self.sleep_ms:
            return self.head(self.body(x))
        for i in range(0, len(self.body), 3):
            x = checkpoint(self.block, i, x, use_reentrant=False) if self.recompute else self.block(i, x)
        return self.head(x)


def offload_activations(device):
    """Saved tensors to host memory in the forward, back in the backward."""
    if device.type == "cuda":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    def pack(t):
        return t.detach().numpy().copy()

    def unpack(array):  # back "to the device": a torch allocation again
        return torch.from_numpy(array).clone()

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class HostSGD(torch.optim.Optimizer):
    """SGD with momentum whose state and update live in host memory (optimizer-state offload).

    The arithmetic is ``torch.optim.SGD``'s on one tensor at a time (dampening 0, no weight decay,
    not Nesterov): the first step's buffer is the gradient, then ``buf = momentum * buf + grad``;
    ``param -= lr * buf``."""

    def __init__(self, params, lr, momentum, device):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.device = device
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if device.type == "cuda":
                    state["momentum_buffer"] = torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
                    state["grad"] = torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
                    state["master"] = p.detach().to("cpu").pin_memory()
                else:  # NumPy memory: host memory outside the torch allocator (the "device" of a CPU job)
                    state["momentum_buffer"] = np.empty(tuple(p.shape), dtype=np.float32)
                state["started"] = False

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, self.state[p], group["lr"], group["momentum"])

    def _update(self, p, state, lr, momentum):
        buf = state["momentum_buffer"]
        if self.device.type == "cuda":
            grad, param = state["grad"], state["master"]
            grad.copy_(p.grad)
            if state["started"]:
                buf.mul_(momentum).add_(grad)
            else:
                buf.copy_(grad)
            param.add_(buf, alpha=-lr)
            p.copy_(param, non_blocking=True)
        else:  # NumPy arithmetic, float32 as torch's: the buffer never passes through a torch op's result
            if state["started"]:
                buf *= momentum
                buf += p.grad.numpy()
            else:
                buf[...] = p.grad.numpy()
            p.add_(torch.from_numpy(buf), alpha=-lr)
        state["started"] = True


def main():
    args = parse_args()
    rank, world, device = setup(args)

    torch.manual_seed(1234)  # identical init on every rank
    model = MLP(args.dim, args.hidden, args.layers, args.recompute, args.matmul, args.sleep_ms).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb)
    if args.offload_optimizer:
        opt = HostSGD(ddp.parameters(), lr=0.01, momentum=0.9, device=device)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    # Drawn on the device, as a prefetching loader would deliver it: a step is the device's work.
    gen = torch.Generator(device=device).manual_seed(1000 + rank)  # per-rank data
    for step in range(args.steps):
        x = torch.randn(args.batch, args.dim, generator=gen, device=device)
        y = torch.randn(args.batch, 1, generator=gen, device=device)
        with offload_activations(device) if args.offload_activations else contextlib.nullcontext():
            loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f", step, loss.item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
