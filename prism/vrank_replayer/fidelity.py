"""Emulation vs the real run, at the sandbox ranks (DESIGN §10: never against ourselves).

Pure functions over what the runs left behind: the real graph (``prism record``), the emulation's
report (:mod:`.emulate_report`) and the sandbox ranks' recorded nodes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from prism.graph.compare import match_ratio
from prism.graph.records import Graph, GroupInfo, Node

__all__ = ["StepError", "RankFidelity", "PeakComparison", "PEAK_KINDS", "compare_peak", "step_errors", "rank_fidelity",
           "losses_equal", "losses_bitwise_equal", "median_steps"]

LOSS_REL_TOLERANCE = 1e-5
"""Losses of a prism run and of the real gloo run differ by rounding only (reduction order)."""


@dataclass(frozen=True, slots=True)
class StepError:
    """Iteration time of the measured steps, emulated (or predicted) vs real."""

    mean_ms: float
    real_mean_ms: float
    mean_rel_error: float
    """(mean − real mean) / real mean."""
    max_rel_error: float
    """max over measured steps of |step − real step| / real step."""
    num_steps: int


def step_errors(steps_ms: Sequence[float], real_steps_ms: Sequence[float], skip: int) -> StepError:
    got, want = list(steps_ms)[skip:], list(real_steps_ms)[skip:]
    n = min(len(got), len(want))
    if n == 0:
        return StepError(math.nan, math.nan, math.nan, math.nan, 0)
    got, want = got[:n], want[:n]
    mean, real = statistics.fmean(got), statistics.fmean(want)
    return StepError(mean, real, (mean - real) / real, max(abs(a - b) / b for a, b in zip(got, want, strict=True)), n)


@dataclass(frozen=True, slots=True)
class RunSpread:
    """How far repeated real runs of one job lie from each other: each run against the per-step
    median of the others (leave one out), the largest of each figure over the runs. An emulation
    cannot be shown closer to the real run than this: it is the ground truth's own error."""

    mean_abs_rel_error: float
    """The largest |mean error| of a run against the others."""
    typical_abs_rel_error: float
    """The median over the runs of |mean error| (one outlier run sets the largest, not this)."""
    max_step_rel_error: float
    num_runs: int


def median_steps(runs_ms: Sequence[Sequence[float]]) -> list[float]:
    """Each step's median over the runs (as many steps as the shortest run has)."""
    return [statistics.median(s) for s in zip(*runs_ms, strict=False)]


def run_spread(runs_ms: Sequence[Sequence[float]], skip: int) -> RunSpread | None:
    """The spread of ``runs_ms`` (step times of each run) over the steps after ``skip``; None with
    fewer than three runs (one run against one other says nothing of which one is off)."""
    if len(runs_ms) < 3:
        return None
    errors = []
    for i, run in enumerate(runs_ms):
        others = [r for j, r in enumerate(runs_ms) if j != i]
        errors.append(step_errors(run, median_steps(others), skip))
    kept = [e for e in errors if e.num_steps]
    if not kept:
        return None
    means = [abs(e.mean_rel_error) for e in kept]
    return RunSpread(max(means), statistics.median(means), max(e.max_rel_error for e in kept), len(runs_ms))


PEAK_KINDS = ("measured", "run")
"""The two peaks of a rank: over the measured steps (after the warmup), over the whole run."""


@dataclass(frozen=True, slots=True)
class PeakComparison:
    """One kind of peak of one rank: the emulated value against the real runs' values.

    A peak is *timing-dependent* when real runs of the same program disagree: a tensor whose last
    user is an asynchronous op lives until the op completes, so whether it is alive at the peak
    depends on when the peers arrive. The emulated peak must then lie in the real spread; where
    the real runs agree, it must equal them.
    """

    emulated_bytes: int
    real_bytes: tuple[int, ...]
    """One value per real run, in run order (-1: unknown)."""
    real_min_bytes: int
    real_max_bytes: int
    timing_dependent: bool
    """The real runs disagree."""
    in_real_spread: bool
    """real min <= emulated <= real max (False if any value is unknown)."""
    equal: bool
    """Every real run gave the emulated value."""


def compare_peak(emulated_bytes: int, real_bytes: Sequence[int]) -> PeakComparison:
    real = tuple(int(b) for b in real_bytes)
    known = bool(real) and emulated_bytes >= 0 and min(real) >= 0
    lo, hi = (min(real), max(real)) if real else (-1, -1)
    return PeakComparison(
        emulated_bytes=emulated_bytes, real_bytes=real, real_min_bytes=lo, real_max_bytes=hi,
        timing_dependent=known and lo != hi,
        in_real_spread=known and lo <= emulated_bytes <= hi,
        equal=known and lo == emulated_bytes == hi,
    )


@dataclass(frozen=True, slots=True)
class RankFidelity:
    rank: int
    signature_match: float
    """Fraction of comm ops whose signature equals the real run's (1.0 = identical sequences)."""
    losses_equal: bool
    """Every step's loss equals the real run's within 1e-5 relative (real gloo: rounding level)."""
    max_loss_rel_diff: float
    time: StepError
    peak_memory_bytes: int
    """The emulated rank's whole-run peak."""
    real_peak_memory_bytes: int
    """The first real run's whole-run peak."""
    peaks: dict[str, PeakComparison]
    """Per kind (:data:`PEAK_KINDS`): the emulated peak against every real run's."""
    peak_in_real_spread: bool
    """Both kinds lie in the real runs' spread."""
    peak_equal: bool
    """Both kinds equal every real run's."""


def _no_loss(x: float | None) -> bool:
    """A step without a loss: NaN in memory, null once written as JSON (prism.core.strict_json)."""
    return x is None or math.isnan(x)


def _loss_diff(a: float | None, b: float | None) -> float:
    if _no_loss(a) or _no_loss(b):
        return 0.0 if _no_loss(a) and _no_loss(b) else math.inf
    return abs(a - b) / max(abs(b), 1e-30)


def losses_equal(got: Sequence[float], want: Sequence[float]) -> bool:
    """Same number of losses, each within :data:`LOSS_REL_TOLERANCE` (no loss equals no loss)."""
    return len(got) == len(want) and all(
        _loss_diff(a, b) <= LOSS_REL_TOLERANCE for a, b in zip(got, want, strict=True))


def losses_bitwise_equal(got: Sequence[float], want: Sequence[float]) -> bool:
    """Same number of losses, each the same float (no loss equals no loss: NaN or null)."""
    return len(got) == len(want) and all(
        (_no_loss(a) and _no_loss(b)) or a == b for a, b in zip(got, want, strict=True))


def rank_fidelity(rank: int, real: Graph, nodes: Sequence[Node], groups: dict[str, GroupInfo], *,
                  losses: Sequence[float], steps_ms: Sequence[float], peak_memory_bytes: int,
                  measured_peak_memory_bytes: int = -1, skip: int,
                  real_repeats: Sequence[Graph] = ()) -> RankFidelity:
    """``real`` is the real run compared with (comm signature, losses); the time is compared with
    each step's median over it and ``real_repeats``, further real runs of the same job (one run's
    steps carry the host's jitter of that run), and so are the peaks, with their spread."""
    summary = real.summaries.get(rank)
    runs = [g.summaries.get(rank) for g in (real, *real_repeats)]
    peaks = {
        "measured": compare_peak(measured_peak_memory_bytes,
                                 [s.measured_peak_memory_bytes if s else -1 for s in runs]),
        "run": compare_peak(peak_memory_bytes, [s.peak_memory_bytes if s else -1 for s in runs]),
    }
    real_losses = list(summary.losses) if summary else []
    diffs = [_loss_diff(a, b) for a, b in zip(losses, real_losses, strict=False)]
    real_steps = median_steps([[t / 1e6 for t in s.step_times_ns] for s in runs if s]) if summary else []
    return RankFidelity(
        rank=rank,
        signature_match=match_ratio(real.nodes[rank], real.groups, nodes, groups),
        losses_equal=losses_equal(losses, real_losses),
        max_loss_rel_diff=max(diffs, default=math.nan),
        time=step_errors(steps_ms, real_steps, skip),
        peak_memory_bytes=peak_memory_bytes,
        real_peak_memory_bytes=summary.peak_memory_bytes if summary else -1,
        peaks=peaks,
        peak_in_real_spread=all(p.in_real_spread for p in peaks.values()),
        peak_equal=all(p.equal for p in peaks.values()),
    )
