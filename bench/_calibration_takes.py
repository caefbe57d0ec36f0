"""The calibrated prediction recomputed from a run directory's calibration takes
(``RUN/calibration/slice-NNN[-k]/rank-R.pkl``, left by ``calibrate_run``) with another merge than
prism's, by the same discrete-event pass (``timed_from_measurements``; no process is started).

prism gives each node of the steady steps its median over the steps, then over the takes
(``typical_steps``, ``median_of_takes``): every rank's step is its typical one, so a collective
waits for the member whose *typical* arrival is last. In a real run each step's late member is
whoever was slow that step, and the step is the simulation of each rank's own spans step by step
(``bench/_debug/jitter_effect.py``: fsdp2-sleep's real graphs, typical spans −0.8 … +2.6 % from
their own per-step simulation). ``CalibrationTakes(run, skip).prediction_steps_ms("per-step")`` keeps each take's
spans step by step, merges take k of every slice into one graph and simulates it, and averages the
steps over the takes. prism's own merges (``median``, ``rotated``: one graph, measured step s of every
rank from take (s − skip) mod k, ``prism calibrate --merge rotated``) are recomputed as prism makes them."""

from __future__ import annotations

import glob
import pickle
import re
import statistics
from pathlib import Path

from prism.calibration import MERGES as PRISM_MERGES
from prism.calibration import merge_takes
from prism.core.rundir import RunDir
from prism.graph.io import read_graph
from prism.graph.records import Node
from prism.vrank_replayer.calibrate_run import structure_kind, timed_from_measurements

__all__ = ["MERGES", "CalibrationTakes"]

MERGES = ("median", "per-step", "rotated")


def _take_index(slice_dir: Path) -> int:
    m = re.fullmatch(r"slice-\d+-(\d+)", slice_dir.name)
    return int(m.group(1)) if m else 0


class CalibrationTakes:
    """A run directory's calibration takes, its structure graph and its job's device, read once."""

    def __init__(self, run: Path, skip: int) -> None:
        rd = RunDir(run)
        self.skip = skip
        self.structure = read_graph(rd.graph_dir(structure_kind(rd)))
        self.device = rd.load_job().device
        by_rank: dict[int, dict[int, tuple[Node, ...]]] = {}
        for d in glob.glob(str(run / "calibration" / "slice-*")):
            for f in glob.glob(f"{d}/rank-*.pkl"):
                with open(f, "rb") as fh:
                    by_rank.setdefault(int(Path(f).stem.split("-")[1]), {})[_take_index(Path(d))] = tuple(pickle.load(fh).nodes)
        self.takes = {r: [by_take[k] for k in sorted(by_take)] for r, by_take in by_rank.items()}
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
        """``median``, ``rotated``: prism's merges (:func:`prism.calibration.merge_takes`), the timed
        graph's steps. ``per-step``: each take's own spans, simulated take by take, each step's mean
        over the takes."""
        if merge in PRISM_MERGES:
            return self.steps_ms({r: merge_takes(ts, self.skip, merge) for r, ts in self.takes.items()})
        if merge != "per-step":
            raise ValueError(f"unknown merge {merge!r}: one of {', '.join(MERGES)}")
        per_take = [self.take_steps_ms(k) for k in range(self.count)]
        return {r: [statistics.fmean(s) for s in zip(*(p[r] for p in per_take), strict=False)] for r in per_take[0]}
