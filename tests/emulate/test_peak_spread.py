"""A peak against the real runs: equal where the real runs agree, in their spread where they do
not (timing-dependent), never when a value is unknown."""

import pytest

from prism.vrank_replayer.fidelity import compare_peak

pytestmark = pytest.mark.timeout(60)


def test_real_runs_that_agree_ask_for_the_same_value():
    c = compare_peak(163_140, [163_140, 163_140, 163_140])
    assert (c.equal, c.in_real_spread, c.timing_dependent) == (True, True, False)
    c = compare_peak(163_396, [163_140, 163_140])
    assert (c.equal, c.in_real_spread, c.timing_dependent) == (False, False, False)


def test_real_runs_that_disagree_give_a_spread():
    c = compare_peak(513_144, [497_564, 513_308, 497_564])
    assert (c.real_min_bytes, c.real_max_bytes) == (497_564, 513_308)
    assert (c.equal, c.in_real_spread, c.timing_dependent) == (False, True, True)
    assert not compare_peak(513_309, [497_564, 513_308]).in_real_spread


def test_an_unknown_value_is_never_in_the_spread():
    for emulated, real in [(-1, [100, 100]), (100, [100, -1]), (100, [])]:
        c = compare_peak(emulated, real)
        assert not (c.equal or c.in_real_spread or c.timing_dependent), (emulated, real)
