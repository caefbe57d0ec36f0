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


def test_validate_shows_no_verdict_for_a_peak_neither_side_measured():
    """A job whose steps are found only afterwards has no measured steps' window while it runs: the
    validate table says so instead of calling the emulated peak out of the real spread."""
    import dataclasses

    from rich.console import Console

    from prism.cli.validate import print_validation

    def peaks(measured_emulated, measured_real):
        return {"measured": dataclasses.asdict(compare_peak(measured_emulated, measured_real)),
                "run": dataclasses.asdict(compare_peak(65_544, [65_544]))}

    time = {"mean_rel_error": 0.01, "max_rel_error": 0.02, "real_mean_ms": 94.3, "mean_ms": 95.2}
    rows = {str(r): {"prism": {"signature_match": 1.0, "losses_bitwise_collected": True, "losses_equal": True,
                               "max_loss_rel_diff": 0.0, "time": time, "peaks": peaks(e, real)},
                     "torch_fake": None}
            for r, (e, real) in {1: (-1, [-1]), 2: (70_000, [65_544])}.items()}
    console = Console(record=True, width=250)
    print_validation({"job": "pp-noopt", "world_size": 4, "sandbox_ranks": [1, 2], "skip_steps": 2,
                      "ranks": rows, "run_dir": "RUN", "emulation": "EMU"}, console)
    text = console.export_text()
    assert "— (not measured)" in text and "70,000 B (OUT of real spread)" in text
    assert text.count("OUT of real spread") == 1
    assert "the measured steps' peak was measured on neither side: no step ended while the job ran" in text


def test_validate_names_rss_as_the_reason_when_the_job_ran_with_it():
    """Under ``PRISM_MEMORY=rss`` every step ends, yet no measured steps' peak exists (RSS cannot be
    reset): the note names that cause, not missing steps."""
    import dataclasses

    from rich.console import Console

    from prism.cli.validate import print_validation

    time = {"mean_rel_error": 0.01, "max_rel_error": 0.02, "real_mean_ms": 200.7, "mean_ms": 208.2}
    peaks = {"measured": dataclasses.asdict(compare_peak(-1, [-1, -1, -1])),
             "run": dataclasses.asdict(compare_peak(332_746_752, [332_746_752]))}
    rows = {"1": {"prism": {"signature_match": 1.0, "losses_bitwise_collected": True, "losses_equal": True,
                            "max_loss_rel_diff": 0.0, "time": time, "peaks": peaks, "memory_source": "cpu.peak_rss"},
                  "torch_fake": None}}
    console = Console(record=True, width=250)
    print_validation({"job": "moe-sleep", "world_size": 4, "sandbox_ranks": [1], "skip_steps": 2,
                      "ranks": rows, "run_dir": "RUN", "emulation": "EMU"}, console)
    text = console.export_text()
    assert "— (not measured)" in text
    assert "the job ran with PRISM_MEMORY=rss" in text
    assert "no step ended" not in text
