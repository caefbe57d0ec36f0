"""``prism calibrate``: timing slices with the ``live`` engine, then inter-slice calibration (DESIGN §7).

1. Recorded data: one capture run of all W ranks (:func:`~.launch.capture_job`, reused when
   RUN/capture/ is complete), from which each slice's recorded data is derived
   (:func:`~prism.nccl_patches.recorded_store.derive_from_capture`). A collection with
   ``values.ranks`` set to a slice gives the same data; capture is what the vrank code supports
   for any rank set today.
2. Slices of S ranks in round-robin (one rank per template when a template map is given): each
   runs its ranks for real with the ``live`` engine while every other rank is a vrank replaying
   the structure graph as soon as it can (:class:`~.clock.AsapClock`). Each real rank's recorded
   nodes (its ``RankRecord``, ``rank-R.pkl``) are its timing measurement.
   With ``repeats`` k > 1 the takes run in k rounds of every slice (slice 1, 2, …, then slice 1,
   2, … again), not a slice's k takes in a row: a host whose speed drifts over the calibration then
   moves every slice's takes alike instead of giving each slice its own stretch of the drift (pp
   1F1B on 16 cores, session 45: its compute between ops moved 6 % from window to window).
   ``between_rounds(k)`` runs after round k (the fidelity benchmark records a real run there, so
   that the calibration and the real runs it is compared with sample one drifting host).
3. The takes become each rank's measured nodes (``merge``, :func:`~prism.calibration.merge_slice`).
   ``rotated`` (the default): each rank keeps its spans step by step, measured step s from take
   (s − skip) mod k (:func:`~prism.calibration.rotated_takes`), so each step's collectives wait for
   whichever rank was slow in it, as a real run's do (docs/emulate.md, "The calibration's merge and
   the ranks' step-to-step jitter", and session 41's figures); a take the host slowed as a whole (its
   slice's measured spans more than 3 % from the median take's) is left out of the rotation
   (:func:`~prism.calibration.typical_takes`, session 43). ``median``:
   :func:`~prism.calibration.typical_steps` gives each steady-step node its median over the slice's
   measured steps (one step's burst of external load is not a slow step of the prediction, but
   neither is any rank's slow step), then :func:`~prism.calibration.median_of_takes` its median
   over the takes. The slices complete every op as soon as the backend has
   (``EmulateOptions.eager_completion``), so an op's duration ends there and not at a wait the
   script makes after its compute. :func:`~prism.calibration.apply_measurements` moves
   the measurements onto the structure graph (``bare`` when collected, else ``real``),
   :func:`~prism.calibration.settle_warmup` gives the warm-up steps' comm ops their steady-state
   durations (a slice's first op on a group also connects its transport) and
   :func:`~prism.calibration.calibrate` runs the discrete-event pass; the timed graph goes to
   RUN/graph/timed.
4. The host is timed before the first take and after each (:func:`~prism.core.host_speed.probe_ms`,
   the timed graph's ``meta["host_probe_ms"]``): a host whose speed moved across the takes gave
   them different machines, and the report says by how much.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prism.calibration import (
    DEFAULT_MERGE,
    MERGES,
    CalibrationReport,
    apply_measurements,
    calibrate,
    crowded_slices,
    merge_slice,
    plan_slices,
    representatives,
    settle_warmup,
)
from prism.core.affinity import usable_cpus
from prism.core.errors import PrismError, RunDirError
from prism.core.host_speed import format_probes, probe_ms
from prism.core.rundir import RunDir
from prism.core.workerspec import record_path
from prism.graph.io import read_graph, write_graph
from prism.graph.memory_pass import timed_with_tracker
from prism.graph.records import Graph, Node, RankSummary
from prism.nccl_patches.algorithms import policy_from_env
from prism.nccl_patches.recorded_store import derive_from_capture, recorded_dir

from .launch import EmulateOptions, capture_job, emulate

__all__ = ["CalibrateResult", "SliceResult", "calibrate_run", "calibration_slices", "calibration_takes", "ensure_recorded", "mean_measured_ns",
           "measured_steps_ns", "structure_kind", "take_dir", "timed_from_measurements"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SliceResult:
    ranks: tuple[int, ...]
    wall_s: float
    step_times_ns: dict[int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class CalibrateResult:
    report: CalibrationReport
    slices: tuple[SliceResult, ...]
    structure: str
    """The graph the measurements were put on: ``bare`` or ``real``."""
    real_steps_ns: dict[int, tuple[int, ...]]
    """Step times of the real run (RUN/graph/real), if recorded; else empty."""
    timed_dir: Path
    wall_s: float
    host_probe_ms: tuple[float, ...] = ()
    """The host's speed before the first take and after each (prism.core.host_speed)."""
    real_timed_with_tracker: bool = False
    """The real run's steps include the CPU memory tracker's cost (``prism record --no-memory-pass``),
    which the slices do not have (:func:`~prism.graph.memory_pass.timed_with_tracker`)."""
    merge: str = DEFAULT_MERGE
    """How each rank's takes became its timing (:data:`~prism.calibration.MERGES`)."""


def structure_kind(run: RunDir) -> str:
    """``bare`` when collected, else ``real`` (the structure of ``prism record``)."""
    for kind in ("bare", "real"):
        if (run.graph_dir(kind) / "manifest.pb").is_file():
            return kind
    raise RunDirError(f"{run.root}: no graph/bare or graph/real (run prism collect or prism record first)")


def measured_steps_ns(graph: Graph) -> dict[int, tuple[int, ...]]:
    return {r: s.step_times_ns for r, s in graph.summaries.items() if s.step_times_ns}


def _capture_complete(capture: Path, world_size: int) -> bool:
    return all((capture / f"rank-{r:05d}.json").is_file() for r in range(world_size))


def _load_record(out_dir: Path, rank: int):
    # The worker's prism.graph.records.RankRecord: this role reads the file the worker wrote.
    with record_path(out_dir, rank).open("rb") as f:
        return pickle.load(f)  # noqa: S301 - our own worker's output


def take_dir(run_root: Path, slice_index: int, take: int) -> Path:
    """Where take ``take`` of slice ``slice_index`` runs: ``calibration/slice-NNN``, then ``slice-NNN-k``."""
    name = f"slice-{slice_index:03d}" if take == 0 else f"slice-{slice_index:03d}-{take}"
    return run_root / "calibration" / name


def calibration_slices(run_root: Path) -> list[tuple[int, ...]]:
    """The ranks each slice of a calibration left in ``run_root`` measured (its first take's records)."""
    dirs = sorted(d for d in (run_root / "calibration").glob("slice-[0-9][0-9][0-9]") if d.is_dir())
    return [tuple(sorted(int(f.stem.removeprefix("rank-")) for f in d.glob("rank-*.pkl"))) for d in dirs]


def calibration_takes(run_root: Path) -> dict[int, list[tuple[Node, ...]]]:
    """Each measured rank's nodes in every take a calibration left in ``run_root`` (:func:`take_dir`),
    in take order."""
    by_rank: dict[int, dict[int, tuple[Node, ...]]] = {}
    for d in (run_root / "calibration").glob("slice-*"):
        if not d.is_dir():
            continue
        take = int(d.name.removeprefix("slice-").partition("-")[2] or 0)
        for f in d.glob("rank-*.pkl"):
            rank = int(f.stem.removeprefix("rank-"))
            by_rank.setdefault(rank, {})[take] = tuple(_load_record(d, rank).nodes)
    return {r: [by_take[k] for k in sorted(by_take)] for r, by_take in by_rank.items()}


def ensure_recorded(run_dir: str | Path, ranks: tuple[int, ...], *, capture: bool = True,
                    timeout_s: float = 600.0) -> Path | None:
    """The recorded data of sandbox set ``ranks``: as found, or derived from the capture run
    (made first when RUN/capture/ is incomplete and ``capture``; else None)."""
    run = RunDir(Path(run_dir))
    target = recorded_dir(run.root, ranks)
    if target.is_dir():
        return target
    job = run.load_job()
    capture_dir = run.root / "capture"
    if not _capture_complete(capture_dir, job.world_size):
        if not capture:
            return None
        capture_job(job, run.root, timeout_s=timeout_s)
    return derive_from_capture(run.root, capture_dir, ranks, tree_all_reduce=policy_from_env(job.env).tree_all_reduce)


def calibrate_run(
    run_dir: str | Path,
    *,
    slice_size: int = 2,
    template_of: Mapping[int, int] | None = None,
    skip_steps: int | None = None,
    repeats: int = 1,
    timeout_s: float = 600.0,
    on_slice: Callable[[int, int, tuple[int, ...]], None] | None = None,
    device: Mapping | None = None,
    merge: str = DEFAULT_MERGE,
    between_rounds: Callable[[int], None] | None = None,
) -> CalibrateResult:
    """Run the timing slices of RUN and write RUN/graph/timed (module docstring).

    ``repeats``: run each slice that many times, in that many rounds of every slice (``merge`` says
    how the takes become the timing); ``between_rounds(k)`` is called after each round but the
    last. ``on_slice(done, total, ranks)`` is called before each take (done = takes finished, of
    slices × repeats) and once at the end. ``device``: the
    :class:`EmulateOptions` layout fields (device_path, sandbox_gpus, assistant_gpus): the slices run
    on the same data path as the emulation. ``merge``: how each rank's takes become its measured
    nodes (:data:`~prism.calibration.MERGES`, :func:`~prism.calibration.merge_slice`)."""
    if merge not in MERGES:
        raise PrismError(f"calibration merge {merge!r}: one of {', '.join(MERGES)}")
    started = time.time()
    run = RunDir(Path(run_dir))
    job = run.load_job()
    kind = structure_kind(run)
    structure = read_graph(run.graph_dir(kind))
    if skip_steps is None:
        skip_steps = job.iterations.warmup
    capture = run.root / "capture"
    if not _capture_complete(capture, job.world_size):
        log.info("capture run of all %d ranks (recorded data for the slices)", job.world_size)
        capture_job(job, run.root, timeout_s=timeout_s)
    slices = plan_slices(representatives(job.world_size, template_of), slice_size)

    def slice_options(ranks: tuple[int, ...], out: Path) -> EmulateOptions:
        return EmulateOptions(ranks=ranks, graph_kind=kind, out_dir=str(out), timeout_s=timeout_s,
                              memory="untracked", phase=f"calibrate/{out.name}", eager_completion=True,
                              flag_divergence=False, **dict(device or {}))

    if slices:
        widest = max(slices, key=len)
        replayers = slice_options(widest, run.root / "calibration").num_replayers
        if crowded := crowded_slices(len(widest), replayers, usable_cpus()):
            log.warning("%s", crowded)
    measured: dict[int, tuple[Node, ...]] = {}
    summaries: dict[int, RankSummary] = {}
    probes = [probe_ms()]
    rounds = max(1, repeats)
    takes: list[dict[int, list[Sequence[Node]]]] = [{r: [] for r in ranks} for ranks in slices]
    steps: list[dict[int, tuple[int, ...]]] = [{} for _ in slices]
    wall = [0.0] * len(slices)
    for k in range(rounds):
        for i, ranks in enumerate(slices):
            if on_slice:
                on_slice(k * len(slices) + i, rounds * len(slices), ranks)
            if k == 0:
                ensure_recorded(run.root, ranks, timeout_s=timeout_s)
            t0 = time.time()
            out = take_dir(run.root, i, k)
            emulate(run.root, slice_options(ranks, out))
            for r in ranks:
                record = _load_record(out, r)
                takes[i][r].append(record.nodes)
                if k == 0:
                    summaries[r] = dataclasses.replace(record.summary, rank=r)
                    steps[i][r] = tuple(record.summary.step_times_ns)
            wall[i] += time.time() - t0
            probes.append(probe_ms())
            log.info("round %d/%d slice %d/%d ranks %s: %.1f s", k + 1, rounds, i + 1, len(slices), list(ranks),
                     time.time() - t0)
        if between_rounds is not None and k < rounds - 1:
            between_rounds(k)
    for i in range(len(slices)):
        measured.update(merge_slice(takes[i], skip_steps, merge))
    results = [SliceResult(ranks, wall[i], steps[i]) for i, ranks in enumerate(slices)]
    if on_slice:
        on_slice(rounds * len(slices), rounds * len(slices), ())
    if template_of:
        first = {template_of.get(r, r): r for r in sorted(measured, reverse=True)}
        for r in range(job.world_size):
            if r not in summaries:
                src = summaries[first[template_of.get(r, r)]]
                summaries[r] = dataclasses.replace(src, rank=r)
    timed, report = timed_from_measurements(structure, measured, skip_steps=skip_steps, device=job.device,
                                            template_of=template_of, summaries=summaries)
    timed = dataclasses.replace(timed, meta={**timed.meta, "structure": kind, "slice_size": str(slice_size),
                                             "merge": merge,
                                             "host_probe_ms": format_probes(probes)})
    write_graph(timed, run.graph_dir("timed"))
    real = read_graph(run.graph_dir("real")) if (run.graph_dir("real") / "manifest.pb").is_file() else None
    return CalibrateResult(report=report, slices=tuple(results), structure=kind,
                           real_steps_ns=measured_steps_ns(real) if real else {},
                           timed_dir=run.graph_dir("timed"), wall_s=time.time() - started,
                           host_probe_ms=tuple(probes),
                           real_timed_with_tracker=real is not None and timed_with_tracker(real.meta), merge=merge)


def timed_from_measurements(structure: Graph, measured: Mapping[int, Sequence[Node]], *, skip_steps: int,
                            device: str, template_of: Mapping[int, int] | None = None,
                            summaries: Mapping[int, RankSummary] | None = None) -> tuple[Graph, CalibrationReport]:
    """The timed graph and its report from each rank's measured nodes (merged takes): onto the
    structure graph, the warm-up steps' comm ops settled, the discrete-event pass. ``device``: the
    job's; on ``cpu`` (gloo) a send completes when its receiver has posted (simulate's docstring)."""
    merged = settle_warmup(apply_measurements(structure, measured, template_of), skip_steps)
    if summaries is not None:
        merged = dataclasses.replace(merged, summaries=dict(summaries))
    if device == "cpu":
        merged = dataclasses.replace(merged, meta={**merged.meta, "p2p": "rendezvous"})
    return calibrate(merged, skip_steps=skip_steps)


def mean_measured_ns(steps: tuple[int, ...], skip: int) -> float:
    kept = list(steps[skip:]) or list(steps)
    return statistics.fmean(kept) if kept else float("nan")
