"""Comm-input hooks for the moe example (``prism collect`` with ``comm_inputs.source: rules``).

A hook is called as ``hook(op, inputs)``: ``op`` describes one comm op of one rank (``op.kind``,
``op.rank``, ``op.group_ranks``, ``op.group_rank``, ``op.seq``, ``op.shape``, ``op.dtype``,
``op.call_site``, ...) and ``inputs`` are that rank's input tensors (copies). It returns the output
tensor (or a list, one per output buffer), or None to leave the op to the filler. It runs in the
``prism collect`` process and never sees another rank's inputs: everything it returns must follow
from the op's description and this rank's own values.

``recv_counts`` answers train.py's token-count exchange (``all_to_all_single(recv_counts, counts)``
at train.py:98) without the other ranks: every source is assumed to route its tokens (as many as this
rank has: ``inputs[0].sum()``) over all experts with a seeded draw keyed by (source, seq), balanced on
average (``SKEW`` sets how uneven; the paper's MoE mock router does the same with logits). Every rank
computes the same global count matrix, so what rank r expects from rank s is the same on every rank.
What a rank *sends* remains its own router's choice, so the token exchange's split sizes do not
agree across ranks and differ from the real run: use it to study memory and time under a chosen
load balance. For the real split sizes, let the count exchange be ``exact`` (the built-in
control-flow rule: the ranks meet for that one small op).
"""

import torch

SKEW = 0.5
"""0: every expert gets the same share; larger: more uneven (a Dirichlet-like spread)."""
SEED = 1234


def recv_counts(op, inputs):
    (counts,) = inputs                       # this rank's tokens per global expert (int64)
    ep, num_experts = len(op.group_ranks), counts.numel()
    per_rank = num_experts // ep             # experts held by each rank
    tokens = int(counts.sum())
    received = []
    for src in range(ep):
        gen = torch.Generator().manual_seed(SEED + 7919 * op.group_ranks[src] + op.seq)
        weights = 1.0 + SKEW * torch.rand(num_experts, generator=gen) * num_experts / 2
        share = torch.floor(weights / weights.sum() * tokens).to(torch.int64)
        share[0] += tokens - int(share.sum())  # source src routes exactly `tokens` tokens
        received.append(share[op.group_rank * per_rank:(op.group_rank + 1) * per_rank])
    return torch.cat(received).to(op.dtype)
