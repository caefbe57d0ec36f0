"""Two peaks per rank: the whole run's, and the measured steps' — from the end of the warmup steps
to the end of the measured ones, opened at the bytes in use then (as
``torch.cuda.reset_peak_memory_stats`` does). The recorder's step boundaries drive the window."""

import pytest
import torch

from prism.sandbox.memory import MemoryMeter, MemoryPeaks
from prism.sandbox.memtrack import StoragePeakTracker
from prism.sandbox.recorder import Recorder

pytestmark = pytest.mark.timeout(60)


def test_the_window_starts_at_the_bytes_in_use_and_stops_when_closed():
    tracker = StoragePeakTracker()
    with tracker:
        kept = torch.zeros(1000)  # 4,000 B, alive across the window
        tmp = torch.zeros(5000)  # 20,000 B before the window: the run's peak only
        del tmp
        assert tracker.window_peak_bytes == -1, "no window yet"
        tracker.open_window()
        assert tracker.window_peak_bytes == 4000
        tmp = torch.zeros(2000)  # 8,000 B in the window
        del tmp
        tracker.close_window()
        tmp = torch.zeros(10_000)  # 40,000 B after the window
        del tmp
    assert (tracker.window_peak_bytes, tracker.peak_bytes) == (12_000, 44_000)
    assert kept.numel() == 1000


def _steps(meter: MemoryMeter, recorder: Recorder, sizes: list[int]) -> MemoryPeaks:
    """One step per size: a temporary of that many float32 elements, then the step boundary."""
    with meter.measuring():
        weights = torch.zeros(250)  # 1,000 B alive for the whole run
        for n in sizes:
            tmp = torch.zeros(n)
            del tmp
            recorder.mark_step()
    assert weights.numel() == 250
    return meter.peaks()


def _meter(**window) -> tuple[MemoryMeter, Recorder]:
    recorder = Recorder(0, 1)
    meter = MemoryMeter("cpu", current_step=lambda: recorder.current_step, **window)
    recorder.add_step_listener(meter.on_step_end)
    return meter, recorder


def test_the_measured_peak_leaves_out_the_warmup_and_what_follows_the_measured_steps():
    meter, recorder = _meter(warmup_steps=1, measured_steps=2)
    peaks = _steps(meter, recorder, [10_000, 500, 700, 20_000])  # warmup, measured, measured, after
    assert peaks == MemoryPeaks(run_bytes=1_000 + 80_000, measured_bytes=1_000 + 2_800, source="cpu.tracked_storage_peak")


def test_without_warmup_the_window_opens_at_once_and_without_an_end_it_runs_to_the_end():
    meter, recorder = _meter(warmup_steps=0, measured_steps=0)
    peaks = _steps(meter, recorder, [10_000, 500])
    assert peaks.measured_bytes == peaks.run_bytes == 1_000 + 40_000


def test_a_run_that_ends_in_its_warmup_has_no_measured_peak():
    meter, recorder = _meter(warmup_steps=3, measured_steps=1)
    peaks = _steps(meter, recorder, [100, 100])
    assert (peaks.run_bytes, peaks.measured_bytes) == (1_000 + 400, -1)


def test_rss_has_no_measured_peak(monkeypatch):
    monkeypatch.setenv("PRISM_MEMORY", "rss")
    meter, recorder = _meter(warmup_steps=0)
    peaks = _steps(meter, recorder, [100])
    assert peaks.source == "cpu.peak_rss" and peaks.run_bytes > 0 and peaks.measured_bytes == -1
