"""FSDP2 example: fully_shard on every block and on the root of a small transformer-ish model, AdamW.

Two config knobs (PrismLLM Table 1's what-ifs, docs/whatif.md), off by default; each a flag or an
environment variable (the variable is read when the flag is absent, so one rank can differ):

* ``--recompute`` / ``FSDP2_RECOMPUTE=1``: activation recomputation, torch.utils.checkpoint on every
  block (non-reentrant; FSDP2 gathers the block's parameters once for its backward either way);
* ``--offload-activations`` / ``FSDP2_OFFLOAD_ACTIVATIONS=1``: the tensors autograd saves go to
  host memory in the forward and come back in the backward (``saved_tensors_hooks``; on CUDA
  ``save_on_cpu(pin_memory=True)``, on a CPU job a NumPy copy: host memory outside the torch
  allocator, which plays the device here).

``FSDP2_KNOB_RANKS=1,3``: the environment knobs apply on these ranks only (a per-rank change).

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import contextlib
import ctypes
import logging
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("fsdp2")


def knob_env():
    """The environment knobs, unless ``FSDP2_KNOB_RANKS`` leaves this rank out."""
    ranks = os.environ.get("FSDP2_KNOB_RANKS", "")
    if ranks and os.environ.get("RANK") not in ranks.split(","):
        return {}
    return os.environ


def parse_args():
    env = knob_env()
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="also sleep this long in each layer's forward and twice as long in its backward "
                        "(compute whose time does not depend on the host's cores)")
    p.add_argument("--recompute", action="store_true", default=env.get("FSDP2_RECOMPUTE") == "1",
                   help="activation recomputation: torch.utils.checkpoint on every block")
    p.add_argument("--offload-activations", action="store_true",
                   default=env.get("FSDP2_OFFLOAD_ACTIVATIONS") == "1",
                   help="keep the tensors autograd saves in host memory between forward and backward")
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


class Block(nn.Module):
    def __init__(self, dim, heads, sleep_ms=0.0):
        super().__init__()
        self.sleep_ms = sleep_ms
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = sleep(x, self.sleep_ms)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, vocab, dim, heads, layers, sleep_ms=0.0, recompute=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, sleep_ms) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)
        self.recompute = recompute

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.recompute else b(x)
        # flatten to (tokens, dim): a 2-D Linear output is not a view (FSDP2 warns about views)
        return self.out(self.norm(x).flatten(0, 1))


def offload_activations(device):
    """Saved tensors to host memory in the forward, back in the backward."""
    if device.type == "cuda":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    def pack(t):
        # Read through the tensor's address: t.numpy() would make the storage non-resizable (and
        # FSDP2 frees an unsharded parameter, which its Linear saves, by resizing its storage to 0),
        # and a torch op writing into the host array would hand its storage to the allocator's
        # accounting (a memory tracker would count the host bytes until the op's result dies).
        t = t.detach()
        itemsize = t.element_size()
        span = (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * itemsize if t.numel() else 0
        raw = np.frombuffer((ctypes.c_byte * span).from_address(t.data_ptr()), dtype=np.uint8)
        dtype = np.dtype(str(t.dtype).removeprefix("torch."))
        view = np.lib.stride_tricks.as_strided(raw.view(dtype), t.shape, [s * itemsize for s in t.stride()])
        return view.copy()

    def unpack(array):  # back "to the device": a torch allocation again
        return torch.from_numpy(array).clone()

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def main():
    args = parse_args()
    rank, world, device = setup(args)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))

    torch.manual_seed(1234)  # identical init on every rank
    model = Model(args.vocab, args.dim, args.heads, args.layers, args.sleep_ms, args.recompute).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1000 + rank)  # per-rank data
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen).to(device)
        with offload_activations(device) if args.offload_activations else contextlib.nullcontext():
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits, tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f", step, loss.item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
