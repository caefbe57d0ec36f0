"""The calibrated prediction recomputed from a run directory's calibration takes (read back by
``calibration_takes``, as ``calibrate_run`` left them) with every merge, through the same
discrete-event pass (``timed_from_measurements``; no process is started).

prism's merges (``prism calibrate --merge``, ``merge_slice``): ``rotated``, the default, one graph
whose measured step s of every rank comes from take (s − skip) mod k of its slice's typical takes, and ``median``, each node of the steady steps
its median over the steps and then over the takes (``typical_steps``, ``median_of_takes``), so every
rank's step is its typical one and a collective waits for the member whose *typical* arrival is
last. In a real run each step's late member is whoever was slow that step
(``bench/_debug/jitter_effect.py``: fsdp2-sleep's real graphs, typical spans −0.8 … +2.6 % from their
own per-step simulation). ``CalibrationTakes(run, skip).prediction_steps_ms("per-step")`` keeps each
take's spans step by step, merges take k of every slice into one graph and simulates it, and
averages the steps over the takes: not one graph, so not a timed graph the vranks could replay."""

from __future__ import annotations

import statistics
from pathlib import Path

from prism.calibration import MERGES as PRISM_MERGES
from prism.calibration import merge_slice
from prism.core.rundir import RunDir
from prism.graph.io import read_graph
from prism.graph.records import Node
from prism.vrank_replayer.calibrate_run import calibration_slices, calibration_takes, structure_kind, timed_from_measurements

__all__ = ["MERGES", "CalibrationTakes"]

MERGES = ("median", "per-step", "rotated")


class CalibrationTakes:
    """A run directory's calibration takes, its structure graph and its job's device, read once."""

    def __init__(self, run: Path, skip: int) -> None:
        rd = RunDir(run)
        self.skip = skip
        self.structure = read_graph(rd.graph_dir(structure_kind(rd)))
        self.device = rd.load_job().device
        self.takes = calibration_takes(run)
        self.slices = calibration_slices(run)
        """The ranks of each slice (a slice's takes are rotated together: ``merge_slice``)."""
        """Each measured rank's takes, in take order (``slice-NNN`` is take 0, ``slice-NNN-k`` take k)."""
        self.count = min(len(ts) for ts in self.takes.values())
        """Takes every measured rank has."""

    def steps_ms(self, measured: dict[int, tuple[Node, ...]]) -> dict[int, list[float]]:
        """Each rank's calibrated step times (ms) from these measurements, through ``calibrate_run``'s
        own merge and discrete-event pass (``timed_from_measurements``)."""
        _, report = timed_from_measurements(self.structure, measured, skip_steps=self.skip, device=self.device)
        return {r: [s / 1e6 for s in c.calibrated_steps_ns] for r, c in report.ranks.items()}

    def take_steps_ms(self, k: int) -> dict[int, list[float]]:
        """Take ``k`` alone, each rank's spans step by step."""
        return self.steps_ms({r: ts[k] for r, ts in self.takes.items()})

    def prediction_steps_ms(self, merge: str) -> dict[int, list[float]]:
        """``median``, ``rotated``: prism's merges (:func:`prism.calibration.merge_slice`), the timed
        graph's steps. ``per-step``: each take's own spans, simulated take by take, each step's mean
        over the takes."""
        if merge in PRISM_MERGES:
            measured = {}
            for ranks in self.slices:
                measured.update(merge_slice({r: self.takes[r] for r in ranks}, self.skip, merge))
            return self.steps_ms(measured)
        if merge != "per-step":
            raise ValueError(f"unknown merge {merge!r}: one of {', '.join(MERGES)}")
        per_take = [self.take_steps_ms(k) for k in range(self.count)]
        return {r: [statistics.fmean(s) for s in zip(*(p[r] for p in per_take), strict=False)] for r in per_take[0]}
