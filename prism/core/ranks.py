"""Rank ranges as users write them: ``0-7``, ``2,5``, ``0-3,8,12-15``."""

from __future__ import annotations

from .errors import PrismError

__all__ = ["parse_rank_ranges", "format_rank_ranges"]


def parse_rank_ranges(text: str, world_size: int | None = None) -> tuple[int, ...]:
    """Parse a rank-range string into a sorted tuple of distinct ranks."""
    ranks: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo_text, hi_text = part.split("-", 1)
                lo, hi = int(lo_text), int(hi_text)
                if hi < lo:
                    raise PrismError(f"rank range {part!r}: end {hi} is before start {lo}")
                ranks.update(range(lo, hi + 1))
            else:
                ranks.add(int(part))
        except ValueError as e:
            if isinstance(e, PrismError):
                raise
            raise PrismError(f"rank range {part!r} in {text!r} is not N or N-M") from e
    if not ranks:
        raise PrismError(f"rank range {text!r} names no rank")
    if world_size is not None:
        bad = sorted(r for r in ranks if r < 0 or r >= world_size)
        if bad:
            raise PrismError(f"ranks {format_rank_ranges(bad)} are outside 0-{world_size - 1}")
    return tuple(sorted(ranks))


def format_rank_ranges(ranks) -> str:
    """Inverse of :func:`parse_rank_ranges`: ``[0,1,2,5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)
