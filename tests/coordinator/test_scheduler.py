"""Slot scheduling: pending-op priority (paper appendix A) and fairness."""

import pytest

from prism.coordinator.cuda_checkpoint import NullSwitcher
from prism.coordinator.scheduler import Candidate, pending_counts, pick_next
from prism.coordinator.state import RankStatus, RunState

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


class _DeviceSwitcher(NullSwitcher):
    """The scheduling contract of CudaSwitcher (ranks hold device memory) without libcuda."""

    moves_device_memory = True


@pytest.mark.parametrize("switcher, handed_on_at", [(NullSwitcher(), "finish"), (_DeviceSwitcher(), "exit")])
def test_a_finishing_rank_hands_its_slot_on_when_its_memory_is_gone(switcher, handed_on_at):
    # One slot, two ranks: rank 1 may start only when rank 0 no longer holds memory on the
    # device — at finish on CPU, at process exit when a rank's device memory stays until then.
    state = RunState(2, 1, switcher=switcher)
    assert state.take_spawns() == [(0, 0)]
    state.finish(0)
    assert state.status(1) is (RankStatus.ACTIVE if handed_on_at == "finish" else RankStatus.NOT_STARTED)
    state.on_exit(0)
    assert state.status(1) is RankStatus.ACTIVE
    assert state.take_spawns() == ([(1, 0)])
