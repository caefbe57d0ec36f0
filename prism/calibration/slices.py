"""Which ranks run for real in which timing slice (DESIGN §7.1).

Slices of S ranks in round-robin order over the ranks that need a measurement: every rank, or
with DP templates only one representative rank per template (its measurements are copied to the
ranks that share the template).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prism.core.errors import PrismError

__all__ = ["plan_slices", "representatives"]


def representatives(world_size: int, template_of: Mapping[int, int] | None = None) -> list[int]:
    """The ranks that must be measured: one per template (the lowest rank), or all ranks."""
    if not template_of:
        return list(range(world_size))
    first: dict[int, int] = {}
    for rank in range(world_size):
        first.setdefault(template_of.get(rank, rank), rank)
    return sorted(first.values())


def plan_slices(ranks: Sequence[int], slice_size: int) -> list[tuple[int, ...]]:
    """Consecutive groups of ``slice_size`` ranks (the last one may be smaller)."""
    if slice_size <= 0:
        raise PrismError(f"slice size must be > 0, got {slice_size}")
    ordered = sorted(set(ranks))
    return [tuple(ordered[i : i + slice_size]) for i in range(0, len(ordered), slice_size)]
