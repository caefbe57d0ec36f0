"""The CPU collective executor: outputs of one matched collective instance from all its inputs.

Reductions use prism's fixed ring order (:mod:`prism.nccl_patches.reduction`): a tensor is
flattened and cut into n ring chunks; chunk c is folded starting at group rank c+1 and ending at
its owner c, in the tensor's own dtype (``avg`` divides by n at the end). Reduce-scatter is the
reduce-scatter phase of that ring: rank c's output is chunk c of the concatenated input. So the
emulator's pruned ring reproduces every collected value bitwise.

Every function takes ``arrivals[group_rank]`` and returns ``outputs[group_rank]``: the tensors
to write into that rank's output buffers, or ``[]`` where the rank receives nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prism.core.errors import MismatchError
from prism.nccl_patches.reduction import chunk_bounds, reduce_chunk, ring_reduce
from prism.rpc import CommHeader

__all__ = ["Arrival", "execute", "execute_p2p", "SUPPORTED_REDUCE_OPS"]

SUPPORTED_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@dataclass(frozen=True, slots=True)
class Arrival:
    header: CommHeader
    inputs: list[torch.Tensor]


def _what(h: CommHeader) -> str:
    return f"{h.op} {h.group_id}:{h.seq}"


def _check_agreement(arrivals: Sequence[Arrival]) -> None:
    first = arrivals[0].header
    for a in arrivals[1:]:
        h = a.header
        for name in ("op", "reduce_op", "root", "flat", "coalesced"):
            if getattr(h, name) != getattr(first, name):
                raise MismatchError(
                    f"collective {first.group_id}:{first.seq}: rank {first.rank} issued {_describe(first)} "
                    f"but rank {h.rank} issued {_describe(h)} ({name} differs)"
                )
    if first.reduce_op and first.reduce_op not in SUPPORTED_REDUCE_OPS:
        raise MismatchError(f"{_what(first)}: reduce op {first.reduce_op!r} is not supported by the CPU executor "
                            f"(supported: {', '.join(SUPPORTED_REDUCE_OPS)})")


def _describe(h: CommHeader) -> str:
    shapes = ",".join(str(tuple(m.shape)) for m in h.inputs) or "-"
    extra = f" {h.reduce_op}" if h.reduce_op else ""
    root = f" root={h.root}" if h.root >= 0 else ""
    return f"{h.op}{extra}{root} {shapes} at {h.call_site or '?'}"


def _same_numel(tensors: Sequence[torch.Tensor], what: str, ranks: Sequence[int]) -> None:
    sizes = {t.numel() for t in tensors}
    if len(sizes) > 1:
        detail = ", ".join(f"rank {r}: {tuple(t.shape)}" for r, t in zip(ranks, tensors, strict=True))
        raise MismatchError(f"{what}: ranks disagree on the tensor size ({detail})")


def _reduce(parts: list[torch.Tensor], op: str, what: str, ranks: Sequence[int]) -> torch.Tensor:
    _same_numel(parts, what, ranks)
    return ring_reduce(parts, op)


def execute(arrivals: Sequence[Arrival]) -> list[list[torch.Tensor]]:
    """Outputs of one collective instance; ``arrivals`` in group-rank order."""
    _check_agreement(arrivals)
    h0 = arrivals[0].header
    n = len(arrivals)
    ranks = [a.header.rank for a in arrivals]
    what = _what(h0)
    ins = [a.inputs for a in arrivals]
    outs_meta = [a.header.outputs for a in arrivals]
    op = h0.op
    group_rank_of = {r: i for i, r in enumerate(h0.group_ranks)}

    if op == "barrier":
        return [[] for _ in arrivals]
    if op == "all_reduce":
        k = len(ins[0])
        reduced = [_reduce([ins[g][i] for g in range(n)], h0.reduce_op, what, ranks) for i in range(k)]
        return [list(reduced) for _ in arrivals]
    if op == "broadcast":
        root = group_rank_of[h0.root]
        return [[t.clone() for t in ins[root]] if g != root else [] for g in range(n)]
    if op == "reduce":
        root = group_rank_of[h0.root]
        k = len(ins[0])
        reduced = [_reduce([ins[g][i] for g in range(n)], h0.reduce_op, what, ranks) for i in range(k)]
        return [reduced if g == root else [] for g in range(n)]
    if op == "all_gather":
        if h0.flat:
            k = len(ins[0])
            gathered = [torch.cat([ins[g][i].reshape(-1) for g in range(n)]) for i in range(k)]
            return [[gathered[i].view(outs_meta[g][i].shape) for i in range(k)] for g in range(n)]
        k = len(ins[0])  # list form: outputs[i * n + j] = rank j's input i
        return [[ins[j][i].view(outs_meta[g][i * n + j].shape) for i in range(k) for j in range(n)]
                for g in range(n)]
    if op == "reduce_scatter":
        return _reduce_scatter(ins, h0, n, what, ranks)
    if op == "all_to_all":
        return _all_to_all(arrivals, n, what)
    if op == "gather":
        root = group_rank_of[h0.root]
        return [[ins[j][0].clone() for j in range(n)] if g == root else [] for g in range(n)]
    if op == "scatter":
        root = group_rank_of[h0.root]
        if len(ins[root]) != n:
            raise MismatchError(f"{what}: root {h0.root} gave {len(ins[root])} tensors for {n} ranks")
        return [[ins[root][g].clone()] for g in range(n)]
    raise MismatchError(f"{what}: the CPU executor has no rule for op {op!r}")


def _reduce_scatter(ins, h0: CommHeader, n: int, what: str, ranks) -> list[list[torch.Tensor]]:
    if h0.flat:
        k = len(ins[0])
        result: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for i in range(k):
            parts = [ins[g][i].reshape(-1) for g in range(n)]
            _same_numel(parts, what, ranks)
            bounds = chunk_bounds(parts[0].numel(), n)
            if parts[0].numel() % n:
                raise MismatchError(f"{what}: input of {parts[0].numel()} elements does not split into {n} ranks")
            for c, (lo, hi) in enumerate(bounds):
                result[c].append(reduce_chunk([p[lo:hi] for p in parts], c, h0.reduce_op))
        return result
    # list form: rank g's input list holds one tensor per destination rank
    result = []
    for c in range(n):
        parts = [ins[g][c].reshape(-1) for g in range(n)]
        _same_numel(parts, what, ranks)
        shape = ins[0][c].shape
        result.append([reduce_chunk(parts, c, h0.reduce_op).view(shape)])
    return result


def _all_to_all(arrivals: Sequence[Arrival], n: int, what: str) -> list[list[torch.Tensor]]:
    h0 = arrivals[0].header
    if not h0.flat:  # list form: rank g's output j is rank j's input g
        return [[arrivals[j].inputs[g].clone() for j in range(n)] for g in range(n)]
    pieces: list[list[torch.Tensor]] = []  # pieces[src][dst]
    for a in arrivals:
        t = a.inputs[0]
        splits = list(a.header.in_splits) or [t.shape[0] // n] * n
        if sum(splits) != t.shape[0]:
            raise MismatchError(f"{what}: rank {a.header.rank} input splits {splits} do not cover {t.shape[0]} rows")
        pieces.append(list(torch.split(t, splits, dim=0)))
    result = []
    for g, a in enumerate(arrivals):
        parts = [pieces[j][g] for j in range(n)]
        want = list(a.header.out_splits)
        got = [p.shape[0] for p in parts]
        if want and want != got:
            raise MismatchError(f"{what}: rank {a.header.rank} expects splits {want} but peers send {got}")
        out = torch.cat(parts, dim=0) if parts else torch.empty(0)
        result.append([out.view(a.header.outputs[0].shape)])
    return result


def execute_p2p(send: Arrival, recv_header: CommHeader) -> list[torch.Tensor]:
    """The receiver's outputs of one matched send/recv pair."""
    if len(send.inputs) != len(recv_header.outputs):
        raise MismatchError(f"send {send.header.rank}->{recv_header.rank} seq {send.header.seq}: "
                            f"{len(send.inputs)} tensors sent, {len(recv_header.outputs)} expected")
    out = []
    for t, m in zip(send.inputs, recv_header.outputs, strict=True):
        if t.numel() != m.numel or t.dtype != m.torch_dtype:
            raise MismatchError(
                f"send {send.header.rank}->{recv_header.rank} on {send.header.group_id} seq {send.header.seq}: "
                f"sent {tuple(t.shape)} {t.dtype} at {send.header.call_site or '?'}, "
                f"receiver expects {m.shape} {m.dtype} at {recv_header.call_site or '?'}"
            )
        out.append(t.view(m.shape))
    return out
