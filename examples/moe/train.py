"""Mixture-of-experts example with expert parallelism: every rank holds --experts-per-rank experts;
a top-1 router picks an expert per token; tokens are dispatched with dist.all_to_all_single using
UNEVEN split sizes, which are themselves exchanged first with an all_to_all_single of an int64 counts
tensor (so the communication shapes depend on the data); expert outputs come back with the reverse
all_to_all_single. Non-expert gradients are averaged with all_reduce over all ranks, expert gradients
over the ranks that hold replicas of the same experts (when W > ep).

A plain PyTorch program (run it with torchrun); it knows nothing about prism.
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

log = logging.getLogger("moe")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None)
    p.add_argument("--ep", type=int, default=0, help="expert-parallel group size (default: WORLD_SIZE)")
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16, help="tokens per rank per step")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="also sleep this long before the dense layer (forward only: its input is the data) "
                        "and, scaled by the tokens this rank's experts receive over --tokens, in the experts' "
                        "forward, twice that in their backward: compute whose time does not depend on the "
                        "host's cores")
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


class AllToAll(torch.autograd.Function):
    """Differentiable uneven all_to_all_single: backward is the same exchange with splits swapped."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return out, None, None, None


class Expert(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class MoEModel(nn.Module):
    def __init__(self, dim, hidden, ep, ep_rank, experts_per_rank, ep_group, sleep_ms=0.0):
        super().__init__()
        self.sleep_ms = sleep_ms
        self.ep, self.epr, self.ep_group = ep, experts_per_rank, ep_group
        self.num_experts = ep * experts_per_rank
        self.pre = nn.Linear(dim, dim)
        self.router = nn.Linear(dim, self.num_experts)
        # Build all experts in the same order on every rank (identical init), keep the local ones.
        all_experts = [Expert(dim, hidden) for _ in range(self.num_experts)]
        self.experts = nn.ModuleList(all_experts[ep_rank * experts_per_rank:(ep_rank + 1) * experts_per_rank])
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        h = torch.relu(self.pre(sleep(x, self.sleep_ms)))
        probs = torch.softmax(self.router(h), dim=-1)
        gate, expert = probs.max(dim=-1)                       # top-1 routing, deterministic
        order = torch.argsort(expert, stable=True)            # group tokens by expert id
        counts = torch.bincount(expert, minlength=self.num_experts)  # int64, per global expert

        # 1) exchange the per-expert token counts: rank r receives, from every source rank,
        #    how many tokens that source sends to each of r's local experts.
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.ep_group)
        send_splits = counts.view(self.ep, self.epr).sum(dim=1).tolist()
        recv_matrix = recv_counts.view(self.ep, self.epr).tolist()   # [source rank][local expert]
        recv_splits = [sum(row) for row in recv_matrix]

        # 2) dispatch tokens (uneven splits), 3) run local experts, 4) combine (reverse exchange).
        routed = AllToAll.apply(h[order], recv_splits, send_splits, self.ep_group)
        routed = sleep(routed, self.sleep_ms * routed.shape[0] / x.shape[0])  # the experts' load
        outs, offset = [], 0
        for row in recv_matrix:
            for e, n in enumerate(row):
                outs.append(self.experts[e](routed[offset:offset + n]))
                offset += n
        expert_out = torch.cat(outs) if outs else routed
        back = AllToAll.apply(expert_out, send_splits, recv_splits, self.ep_group)
        y = torch.empty_like(back).index_copy(0, order, back)   # undo the sort
        y = h + gate.unsqueeze(-1) * y
        return self.head(y)


def main():
    args = parse_args()
    rank, world, device = setup(args)
    ep = args.ep or world
    assert world % ep == 0, "WORLD_SIZE must be a multiple of --ep"
    ep_rank = rank % ep
    # Expert-parallel groups: consecutive blocks of ep ranks. Replica groups: same ep_rank.
    ep_group = replica_group = None
    for b in range(world // ep):
        g = dist.new_group(list(range(b * ep, (b + 1) * ep)))
        if rank // ep == b:
            ep_group = g
    if world > ep:
        for e in range(ep):
            g = dist.new_group(list(range(e, world, ep)))
            if ep_rank == e:
                replica_group = g

    torch.manual_seed(1234)  # identical init on every rank
    model = MoEModel(args.dim, args.hidden, ep, ep_rank, args.experts_per_rank, ep_group, args.sleep_ms).to(device)
    expert_params = list(model.experts.parameters())
    expert_ids = {id(p) for p in expert_params}
    dense_params = [p for p in model.parameters() if id(p) not in expert_ids]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    gen = torch.Generator().manual_seed(1000 + rank)  # per-rank data
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.dim, generator=gen).to(device)
        y = torch.randn(args.tokens, 1, generator=gen).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()

        # Global loss = mean of the per-rank losses.
        for p in dense_params:
            dist.all_reduce(p.grad)
            p.grad /= world
        for p in expert_params:
            if replica_group is not None:
                dist.all_reduce(p.grad, group=replica_group)
            p.grad /= world

        opt.step()
        opt.zero_grad()
        if rank == 0:
            log.info("step %d loss %.6f", step, loss.item())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
