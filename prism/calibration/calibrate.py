"""Inter-slice calibration (DESIGN §7.2, paper §5.3).

Each slice measured its real ranks while their peers were virtual and answered at once, so a
rank's own step time in its slice leaves out every wait on slower peers: pipeline bubbles,
stragglers, skew. Calibration merges all slices into one graph and runs the discrete-event pass
over it, which propagates those dependencies and gives one globally consistent timeline: the
timed graph. The report shows both, per rank, as the paper does (its 235B case: 5.7 s → 5.13 s).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prism.graph.records import Graph
from prism.graph.simulate import simulate, timed_graph

__all__ = ["CalibrationReport", "RankCalibration", "calibrate"]


@dataclass(frozen=True, slots=True)
class RankCalibration:
    rank: int
    uncalibrated_step_ns: float
    """Mean step time the rank measured in its own slice (peers answering at once)."""
    calibrated_step_ns: float
    """Mean step time of the rank in the calibrated global timeline."""
    calibrated_steps_ns: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CalibrationReport:
    skip_steps: int
    ranks: dict[int, RankCalibration]

    @property
    def iteration_ns(self) -> float:
        """The job's iteration time: the slowest rank's calibrated mean step."""
        return max(r.calibrated_step_ns for r in self.ranks.values())

    @property
    def uncalibrated_iteration_ns(self) -> float:
        return max(r.uncalibrated_step_ns for r in self.ranks.values())


def _mean(values, skip: int) -> float:
    kept = list(values)[skip:] or list(values)
    return statistics.fmean(kept) if kept else 0.0


def calibrate(merged: Graph, *, skip_steps: int = 1) -> tuple[Graph, CalibrationReport]:
    """(timed graph, report) from a graph whose nodes carry slice-measured durations."""
    sim = simulate(merged)
    ranks = {}
    for rank, timeline in sim.ranks.items():
        summary = merged.summaries.get(rank)
        own = summary.step_times_ns if summary else ()
        ranks[rank] = RankCalibration(
            rank=rank,
            uncalibrated_step_ns=_mean(own, skip_steps) if own else 0.0,
            calibrated_step_ns=_mean(timeline.step_times_ns, skip_steps),
            calibrated_steps_ns=timeline.step_times_ns,
        )
    return timed_graph(merged, sim), CalibrationReport(skip_steps=skip_steps, ranks=ranks)
