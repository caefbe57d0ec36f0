"""Which ranks run for real in which timing slice (DESIGN §7.1).

Slices of S ranks in round-robin order over the ranks that need a measurement: every rank, or
with DP templates only one representative rank per template (its measurements are copied to the
ranks that share the template).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prism.core.errors import PrismError

__all__ = ["crowded_slices", "plan_slices", "representatives"]


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


def crowded_slices(slice_size: int, num_replayers: int, cpus: int) -> str | None:
    """What to tell the user when a slice's processes (its real ranks and the replayers hosting its
    vranks) outnumber the CPUs this host gives prism, else None. Such a slice's ranks and its
    replayer (vranks answering at once) take turns on the cores: pp_sleep_noopt on 2 CPUs was
    calibrated +2.6 … +3.6 % with slices of 2 against +1.1 … +1.9 % with slices of 1 (docs/emulate.md,
    "Hosts smaller than a slice")."""
    processes = slice_size + num_replayers
    if processes <= cpus:
        return None
    fits = cpus - num_replayers
    hint = f"; slices of {fits} fit this host (--slice-size)" if 1 <= fits < slice_size else ""
    return (f"a calibration slice runs {slice_size} real rank(s) and {num_replayers} replayer(s), {processes} "
            f"processes on {cpus} CPU(s): they share cores, and the calibrated times can come out long "
            f"(docs/emulate.md, \"Hosts smaller than a slice\"){hint}")
