"""Slot scheduling: pending-op priority (paper appendix A) and fairness."""

import pytest

from prism.coordinator.scheduler import Candidate, pending_counts, pick_next

pytestmark = pytest.mark.timeout(30)


def test_rank_that_unblocks_most_pending_ops_goes_first():
    pending = pending_counts([[3, 5], [5], [6]])  # rank 5 is missing from two instances
    cands = [Candidate(r, 0) for r in (1, 3, 5, 6)]
    assert pick_next(cands, pending, now=10, starvation_grants=100).rank == 5


def test_ties_go_to_the_longest_waiting_then_the_lowest_rank():
    cands = [Candidate(4, 7), Candidate(2, 3), Candidate(1, 3)]
    assert pick_next(cands, pending_counts([]), now=10, starvation_grants=100).rank == 1


def test_a_starving_rank_overtakes_priority():
    pending = pending_counts([[5], [5], [5]])
    cands = [Candidate(5, 90), Candidate(2, 0)]
    assert pick_next(cands, pending, now=100, starvation_grants=50).rank == 2
    assert pick_next(cands, pending, now=40, starvation_grants=50).rank == 5


def test_nothing_to_pick():
    assert pick_next([], pending_counts([]), now=0, starvation_grants=1) is None
