"""The real runs' own spread: each run against the per-step median of the others, over the steps
after the warm-up; the figure an emulation's error is read against."""

import pytest

from prism.vrank_replayer.fidelity import run_spread

pytestmark = pytest.mark.timeout(60)


def test_runs_that_agree_have_no_spread():
    s = run_spread([[900.0, 100.0, 100.0]] * 3, skip=1)
    assert (s.mean_abs_rel_error, s.typical_abs_rel_error, s.max_step_rel_error, s.num_runs) == (0.0, 0.0, 0.0, 3)


def test_one_slow_run_sets_the_largest_error_not_the_typical_one():
    # Run 2 is 20 % slower on its measured steps; the warm-up step (first) is left out.
    runs = [[5000.0, 100.0, 100.0], [10.0, 100.0, 100.0], [1.0, 120.0, 120.0]]
    s = run_spread(runs, skip=1)
    assert s.mean_abs_rel_error == pytest.approx(0.20)
    assert s.max_step_rel_error == pytest.approx(0.20)
    # Runs 0 and 1 against the median of the other two (110 ms): 100 / 110 − 1.
    assert s.typical_abs_rel_error == pytest.approx(1 / 11)


def test_fewer_than_three_runs_or_no_measured_step_give_no_spread():
    assert run_spread([[1.0, 2.0], [1.0, 2.0]], skip=1) is None
    assert run_spread([[1.0], [1.0], [1.0]], skip=1) is None
