"""Which waiting rank gets a free slot (the paper's appendix A, with fairness).

A rank's *pending count* is the number of unresolved comm instances that wait for it: collective
instances where some members have arrived but it has not, plus recvs whose sender it is. A free
slot goes to the candidate (a rank whose op is resolved, or one not started yet) with the highest
pending count, since running it unblocks the most waiters; ties go to the one that has waited
longest. A candidate passed over for more than ``starvation_grants`` grants goes first regardless.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Candidate", "pick_next", "pending_counts"]


@dataclass(frozen=True, slots=True)
class Candidate:
    rank: int
    waiting_since: int
    """Grant counter value when the rank became a candidate (not started: 0)."""


def pending_counts(waiting_for: Iterable[Iterable[int]]) -> Counter[int]:
    """``waiting_for`` yields, per unresolved instance, the ranks it still waits for."""
    counts: Counter[int] = Counter()
    for ranks in waiting_for:
        counts.update(ranks)
    return counts


def pick_next(candidates: Iterable[Candidate], pending: Counter[int], *, now: int,
              starvation_grants: int) -> Candidate | None:
    best, best_key = None, None
    for c in candidates:
        waited = now - c.waiting_since
        key = (waited > starvation_grants, pending.get(c.rank, 0), waited, -c.rank)
        if best_key is None or key > best_key:
            best, best_key = c, key
    return best
