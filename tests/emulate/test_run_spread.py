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


def test_validate_shows_the_real_runs_spread_beside_the_emulated_error():
    import dataclasses

    from rich.console import Console

    from prism.cli.validate import print_validation
    from prism.vrank_replayer.fidelity import compare_peak

    peak = dataclasses.asdict(compare_peak(65_544, [65_544]))
    spread = run_spread([[5000.0, 100.0, 100.0], [10.0, 100.0, 100.0], [1.0, 120.0, 120.0]], skip=1)
    time = {"mean_rel_error": 0.01, "max_rel_error": 0.02, "real_mean_ms": 100.0, "mean_ms": 101.0}
    rows = {str(r): {"prism": {"signature_match": 1.0, "losses_bitwise_collected": True, "losses_equal": True,
                               "max_loss_rel_diff": 0.0, "time": time, "peaks": {"measured": peak, "run": peak},
                               "real_time_spread": s},
                     "torch_fake": None}
            for r, s in {0: dataclasses.asdict(spread), 1: None}.items()}
    console = Console(record=True, width=250)
    print_validation({"job": "j", "world_size": 2, "sandbox_ranks": [0, 1], "skip_steps": 1, "real_repeats": 3,
                      "ranks": rows, "run_dir": "RUN", "emulation": "EMU"}, console)
    line = next(x for x in console.export_text().splitlines() if "real runs among themselves" in x)
    assert "±20.00 % (max step 20.00 %)" in line and "— (--real-repeats 3 or more)" in line
