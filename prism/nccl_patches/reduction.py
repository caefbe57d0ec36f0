"""The reduction order prism fixes for every reduction, shared by the collect-time CPU executor
and the pruned ring algorithms of the emulator, so that both produce bitwise-equal results.

A tensor reduced over a group of n ranks is flattened and split into n ring chunks
(:func:`chunk_bounds`: as even as possible, the first ``numel % n`` chunks one element longer).
Chunk ``c`` is accumulated along the ring the way the reduce-scatter phase of a ring all-reduce
does it: it starts at group rank ``c+1``, each next rank applies ``acc = op(acc, own)``, and it
ends at its owner, group rank ``c`` (:func:`ring_order`). ``avg`` is a sum divided by n at the
end; ``premul_sum`` multiplies each input by its factor first. Arithmetic is done in the tensor's
own dtype, rounding at each step, as a ring does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["chunk_bounds", "ring_order", "combine", "reduce_chunk", "ring_reduce", "reduce_two", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """[start, end) of each of the n ring chunks of a flat tensor of ``numel`` elements."""
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for c in range(n):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_order(chunk: int, n: int) -> list[int]:
    """Group ranks in the order they fold into ``chunk``: c+1, c+2, ..., c (the owner last)."""
    return [(chunk + 1 + k) % n for k in range(n)]


def combine(acc: torch.Tensor, own: torch.Tensor, op: str) -> torch.Tensor:
    """One ring step: ``op(acc, own)`` (a new tensor)."""
    if op in ("sum", "avg", "premul_sum"):
        return acc + own
    if op == "product":
        return acc * own
    if op == "min":
        return torch.minimum(acc, own)
    if op == "max":
        return torch.maximum(acc, own)
    if op == "band":
        return acc & own
    if op == "bor":
        return acc | own
    if op == "bxor":
        return acc ^ own
    raise ValueError(f"unknown reduce op {op!r} (known: {', '.join(REDUCE_OPS)})")


def finish(value: torch.Tensor, op: str, n: int) -> torch.Tensor:
    """The last step of ``avg``: divide by the group size (floor division for integers)."""
    if op != "avg":
        return value
    return value / n if value.is_floating_point() or value.is_complex() else torch.div(value, n, rounding_mode="floor")


def reduce_chunk(parts: Sequence[torch.Tensor], chunk: int, op: str) -> torch.Tensor:
    """Reduce one chunk given every group rank's slice of it (``parts[group_rank]``)."""
    n = len(parts)
    order = ring_order(chunk, n)
    acc = parts[order[0]].clone()
    for r in order[1:]:
        acc = combine(acc, parts[r], op)
    return finish(acc, op, n)


def ring_reduce(inputs: Sequence[torch.Tensor], op: str, *, premul: Sequence[float] | None = None) -> torch.Tensor:
    """The reduced value of ``inputs[group_rank]`` (same shape and dtype) in prism's ring order."""
    n = len(inputs)
    flat = [t.reshape(-1) for t in inputs]
    if op == "premul_sum":
        assert premul is not None and len(premul) == n, "premul_sum needs one factor per rank"
        flat = [f * s for f, s in zip(flat, premul, strict=True)]
    out = torch.empty_like(flat[0])
    for c, (lo, hi) in enumerate(chunk_bounds(out.numel(), n)):
        if hi > lo:
            out[lo:hi] = reduce_chunk([f[lo:hi] for f in flat], c, op)
    return out.view_as(inputs[0])


_INTO = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
         "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def reduce_two(a: torch.Tensor, b: torch.Tensor, op: str, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`ring_reduce` of two flat operands of one dtype in one elementwise op, into ``out`` when
    given: each element is one application of a commutative op, so the ring's order (chunk 0 as
    ``b op a``, chunk 1 as ``a op b``) gives the same bits (the one exception: where both operands
    are NaN, which NaN's payload survives). A pair's exchange runs it on the script's thread, where
    the ring's slices and clones cost a dispatcher call each. Complex operands (a product's imaginary
    part is a sum whose order the kernels choose) and ``premul_sum`` (its factors) take
    :func:`ring_reduce`."""
    into = _INTO.get(op)
    if into is None or a.is_complex():
        value = ring_reduce([a, b], op)
        return value if out is None else out.copy_(value)
    value = into(a, b) if out is None else into(a, b, out=out)
    if op != "avg":
        return value
    if value.is_floating_point() or value.is_complex():
        return value.div_(2)
    return value.div_(2, rounding_mode="floor")
