"""The calibrated prediction recomputed from a run directory's calibration takes
(``RUN/calibration/slice-NNN[-k]/rank-R.pkl``, left by ``calibrate_run``) with another merge than
prism's, by the same discrete-event pass (``timed_from_measurements``; no process is started).

prism gives each node of the steady steps its median over the steps, then over the takes
(``typical_steps``, ``median_of_takes``): every rank's step is its typical one, so a collective
waits for the member whose *typical* arrival is last. In a real run each step's late member is
whoever was slow that step, and the step is the simulation of each rank's own spans step by step
(``bench/_debug/jitter_effect.py``: fsdp2-sleep's real graphs, typical spans −0.8 … +2.6 % from
their own per-step simulation). ``prediction_steps_ms(run, skip, "per-step")`` keeps each take's
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

__all__ = ["MERGES", "prediction_steps_ms", "steps_ms", "takes_by_rank"]

MERGES = ("median", "per-step", "rotated")


def takes_by_rank(run: Path) -> dict[int, list[tuple[Node, ...]]]:
    """Each measured rank's takes, in take order (``slice-NNN`` is take 0, ``slice-NNN-k`` take k)."""
    def take(d: str) -> int:
        m = re.fullmatch(r"slice-\d+-(\d+)", Path(d).name)
        return int(m.group(1)) if m else 0

    takes: dict[int, dict[int, tuple[Node, ...]]] = {}
    for d in glob.glob(str(run / "calibration" / "slice-*")):
        for f in glob.glob(f"{d}/rank-*.pkl"):
            with open(f, "rb") as fh:
                takes.setdefault(int(Path(f).stem.split("-")[1]), {})[take(d)] = tuple(pickle.load(fh).nodes)
    return {r: [by_take[k] for k in sorted(by_take)] for r, by_take in takes.items()}


def steps_ms(run: Path, measured: dict[int, tuple[Node, ...]], skip: int) -> dict[int, list[float]]:
    """Each rank's calibrated step times (ms) from these measurements, through ``calibrate_run``'s
    own merge and discrete-event pass (``timed_from_measurements``)."""
    rd = RunDir(run)
    structure = read_graph(rd.graph_dir(structure_kind(rd)))
    _, report = timed_from_measurements(structure, measured, skip_steps=skip, device=rd.load_job().device)
    return {r: [s / 1e6 for s in c.calibrated_steps_ns] for r, c in report.ranks.items()}


def prediction_steps_ms(run: Path, skip: int, merge: str = "per-step") -> dict[int, list[float]]:
    """``median``, ``rotated``: prism's merges (:func:`prism.calibration.merge_takes`), the timed
    graph's steps. ``per-step``: each take's own spans, simulated take by take, each step's mean
    over the takes."""
    takes = takes_by_rank(run)
    if merge in PRISM_MERGES:
        return steps_ms(run, {r: merge_takes(ts, skip, merge) for r, ts in takes.items()}, skip)
    if merge != "per-step":
        raise ValueError(f"unknown merge {merge!r}: one of {', '.join(MERGES)}")
    count = min(len(ts) for ts in takes.values())
    per_take = [steps_ms(run, {r: ts[k] for r, ts in takes.items()}, skip) for k in range(count)]
    return {r: [statistics.fmean(s) for s in zip(*(p[r] for p in per_take), strict=False)] for r in per_take[0]}

