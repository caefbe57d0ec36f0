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

__all__ = ["StepError", "RankFidelity", "step_errors", "rank_fidelity", "losses_equal", "losses_bitwise_equal"]

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
class RankFidelity:
    rank: int
    signature_match: float
    """Fraction of comm ops whose signature equals the real run's (1.0 = identical sequences)."""
    losses_equal: bool
    """Every step's loss equals the real run's within 1e-5 relative (real gloo: rounding level)."""
    max_loss_rel_diff: float
    time: StepError
    peak_memory_bytes: int
    real_peak_memory_bytes: int


def _loss_diff(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) / max(abs(b), 1e-30)


def losses_equal(got: Sequence[float], want: Sequence[float]) -> bool:
    """Same number of losses, each within :data:`LOSS_REL_TOLERANCE` (NaN equals NaN)."""
    return len(got) == len(want) and all(
        _loss_diff(a, b) <= LOSS_REL_TOLERANCE for a, b in zip(got, want, strict=True))


def losses_bitwise_equal(got: Sequence[float], want: Sequence[float]) -> bool:
    """Same number of losses, each the same float (NaN equals NaN)."""
    return len(got) == len(want) and all(
        (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, want, strict=True))


def rank_fidelity(rank: int, real: Graph, nodes: Sequence[Node], groups: dict[str, GroupInfo], *,
                  losses: Sequence[float], steps_ms: Sequence[float], peak_memory_bytes: int,
                  skip: int) -> RankFidelity:
    summary = real.summaries.get(rank)
    real_losses = list(summary.losses) if summary else []
    diffs = [_loss_diff(a, b) for a, b in zip(losses, real_losses, strict=False)]
    real_steps = [s / 1e6 for s in summary.step_times_ns] if summary else []
    return RankFidelity(
        rank=rank,
        signature_match=match_ratio(real.nodes[rank], real.groups, nodes, groups),
        losses_equal=losses_equal(losses, real_losses),
        max_loss_rel_diff=max(diffs, default=math.nan),
        time=step_errors(steps_ms, real_steps, skip),
        peak_memory_bytes=peak_memory_bytes,
        real_peak_memory_bytes=summary.peak_memory_bytes if summary else -1,
    )
