"""Start an emulation: sandbox rank workers (``live`` engine) plus replayers, under one supervisor.

This module starts both roles by module name and spec file and imports neither the sandbox
nor anything above it (``prism.sandbox.worker --spec``, ``prism.vrank_replayer.replayer --spec``).
The launcher hosts two kinds of rendezvous in one TCPStore: the script's logical store (W
participants, of which only the sandbox ranks exist; the lowest sandbox rank completes store
barriers for the others, ``ShimConfig.present_ranks``) and the transports' stores (one prefix per
logical group that has a sandbox member). The first process that fails stops all of them.

:func:`capture_job` runs every rank of the job as a sandbox rank (no replayer): a real all-rank
run whose reductions follow prism's ring order — the values a collection produces — saving
every rank's inputs and outputs of every op, from which
:func:`~prism.nccl_patches.recorded_store.derive_from_capture` computes the recorded data of any
sandbox set without ``prism collect``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import math
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from prism.core.config import JobConfig
from prism.core.errors import PrismError, RankFailedError, RankOOMError, RunDirError
from prism.core.hangwatch import HangWatcher, rank_timeout_s
from prism.core.hosts import reachable_host
from prism.core.isolation import Workspace, isolated_run
from prism.core.layout import DeviceLayout, device_layout
from prism.core.mps import private_mps
from prism.core.rundir import RunDir
from prism.core.supervise import Supervisor, package_env
from prism.core.atomic import atomic_write_bytes, atomic_write_text
from prism.core.whatif import SandboxChange
from prism.core.workerspec import WORKER_MODULE, ShimConfig, WorkerSpec, physical_slot, record_path, with_ooms
from prism.graph.io import read_graph, verify_graph
from prism.graph.memory_pass import memory_pass_job, needs_memory_pass, timed_pass_job, with_tracked_peaks
from prism.graph.opsig import recorded_ops
from prism.nccl_patches.algorithms import policy_from_env
from prism.nccl_patches.recorded_store import check_files, derive_from_capture, recorded_dir
from prism.nccl_patches.restrict_store import derive_subset, find_superset_dir

from .replayer import REPLAYER_MODULE, ReplayerSpec, replayer_result_path

__all__ = [
    "EmulateOptions",
    "SandboxRankResult",
    "ReplayerResult",
    "EmulateResult",
    "emulate",
    "capture_job",
    "with_steps",
    "timed_run_tracked",
    "PROFILE_DIR",
]

MEMORY_PASS_DIR = "memory-pass"
"""The untimed, tracked emulation whose peaks the timed one reports (``EmulateOptions.memory_pass``)."""
PROFILE_DIR = "profile"
"""``--profile``: the sandbox ranks' torch.profiler traces, <out>/profile/rank<R>.json."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class EmulateOptions:
    ranks: tuple[int, ...]
    """The sandbox set: logical ranks that run the real script."""
    steps: int | None = None
    """Run this many steps (overrides the script's ``--steps``); None: as recorded."""
    num_replayers: int = 1
    graph_kind: str = ""
    """Which graph the replayers walk: ``bare`` (collect) or ``real`` (record); "" = bare if present."""
    recorded_dir: str = ""
    """Recorded data of the sandbox set; "" = RUN/payloads/pruned/<set>."""
    capture_dir: str = ""
    """If set, each sandbox rank saves its inputs and outputs of every op here."""
    timed_graph_dir: str = ""
    """If set, the vranks follow this timed graph in real time (``TimedClock``); else they answer ASAP."""
    out_dir: str = ""
    """Where the workers and replayers write; "" = RUN/emulations/<time>/ranks-<set>."""
    timeout_s: float = 600.0
    memory_cap_bytes: int | None = None
    """Per sandbox rank memory cap (0: none); None: the job's ``memory_cap_bytes``."""
    profile: bool = False
    """Run each sandbox rank under ``torch.profiler``: a Chrome trace per rank in <out>/profile/rank<R>.json."""
    device_path: str = "auto"
    """GPU jobs: ``nccl`` (sandbox and assistant GPUs, device-to-device), ``host`` (gloo, host
    staging), ``auto`` (nccl when the GPUs allow it; prism.core.layout)."""
    sandbox_gpus: tuple[int, ...] = ()
    """GPUs for the sandbox ranks (round-robin); () = the layout's default."""
    assistant_gpus: tuple[int, ...] = ()
    """GPUs for the replayers; () = the layout's default."""
    mps: bool = False
    """GPU jobs: run the sandbox ranks and replayers under a private CUDA MPS server
    (prism.core.mps), so processes sharing a GPU (the ``ipc`` path) are not time-sliced."""
    memory: str = "pass"
    """CPU jobs with tracked peaks. ``pass``: the peaks come from a second, untimed emulation
    (``<out>/memory-pass``) and the timed one runs without the per-op tracker
    (prism.graph.memory_pass); with a memory cap the tracked one runs first and a rank above the
    cap fails there (then it is the result); ``inline``: one emulation, tracked and timed (the tracker's ~5 µs
    per aten op in every step); ``untracked``: one emulation without the tracker (RSS peaks: for
    runs that only time, such as calibration slices)."""
    eager_completion: bool = False
    """The sandbox ranks' ops are completed by a helper thread as soon as the backend finished
    them, so each op's duration ends at its completion and not at the script's wait for it (what
    calibration slices measure, docs/timing.md); else, as in ``prism record``, the waiting thread
    completes a message."""
    flag_divergence: bool = True
    """The sandbox ranks compare what they send (a send, a pair's input) with the recorded data and
    flag the ops that differ (``diverged_ops``). Off for runs whose flags nobody reads (calibration
    slices); the timed pass of a two-pass emulation leaves it to its memory pass, whose flags the
    result takes, as it takes that pass's peaks."""
    phase: str = ""
    """Names the run's outputs, RUN/outputs/<phase>/ (prism.core.isolation); "" = emulate/<the out dir's name>."""
    change: SandboxChange = SandboxChange()
    """What-if: the sandbox ranks run the job with this change (env, args, entrypoint)."""
    clock: str = ""
    """With a timed graph: ``cosim`` (vranks simulated online, following the sandbox) or
    ``offset`` (the per-vrank offset clock); see ``ReplayerSpec.clock``. "" (default): ``cosim``
    for a what-if (``change``), else ``offset`` — the clock every fidelity figure of the unchanged
    emulation (CPU and GPU) was measured with."""


@dataclass(frozen=True, slots=True)
class SandboxRankResult:
    rank: int
    losses: tuple[float, ...]
    step_times_ns: tuple[int, ...]
    num_ops: int
    diverged_ops: tuple[str, ...]
    """Ops whose input differed from the recorded one (outputs are recorded + Δ): ``<op> <key>``."""
    num_transports: int
    num_connections: int
    """Physical peers over all its transports."""
    traffic_bytes: int
    first_op_done_s: float | None
    """Seconds from launch to this rank's first completed op."""
    peak_rss_bytes: int
    lazy_transports: tuple[str, ...] = ()
    """Groups whose transport connected inside an op, not when the script created the group."""


@dataclass(frozen=True, slots=True)
class ReplayerResult:
    index: int
    num_channels: int
    num_transports: int
    num_connections: int
    num_ops: int
    num_steps: int
    traffic_bytes: int
    peak_rss_bytes: int
    first_op_done_s: float | None
    num_recorded_outputs: int = 0
    """Delegated paths: collective parts answered with the recorded outputs (the ring not run)."""
    num_transfer_holds: int = 0
    """CPU lanes: collectives whose outputs the replayer held for the group's transfer time."""


@dataclass(frozen=True, slots=True)
class EmulateResult:
    world_size: int
    ranks: dict[int, SandboxRankResult]
    replayers: tuple[ReplayerResult, ...]
    wall_s: float
    out_dir: Path
    graph_kind: str
    extra: dict = field(default_factory=dict)


def _steps_arg(args: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the script's ``--steps`` value is in ``args``: its index and the prefix before it there
    (``--steps=`` in the joined form, nothing in ``--steps N``)."""
    for i, a in enumerate(args):
        if a == "--steps" and i + 1 < len(args):
            return i + 1, ""
        if a.startswith("--steps="):
            return i, "--steps="
    return None


def with_steps(job: JobConfig, steps: int | None) -> JobConfig:
    """The job with the script's ``--steps`` set to ``steps``."""
    if steps is None:
        return job
    at = _steps_arg(job.args)
    if at is None:
        raise PrismError(f"steps: the job's args {list(job.args)} have no --steps to override")
    i, prefix = at
    args = list(job.args)
    args[i] = f"{prefix}{steps}"
    return dataclasses.replace(job, args=tuple(args))


def script_steps(job: JobConfig) -> int | None:
    """The script's ``--steps`` in the job's args, if it has one."""
    at = _steps_arg(job.args)
    if at is None:
        return None
    i, prefix = at
    try:
        return int(job.args[i].removeprefix(prefix))
    except ValueError:
        return None


def _check_steps(recorded: JobConfig, job: JobConfig) -> None:
    """The vranks replay the recorded steps only: a sandbox rank that runs more would meet no peer
    at its next collective (the replayer has ended and closed its transports)."""
    steps, recorded_steps = script_steps(job), script_steps(recorded)
    if steps is not None and steps < 1:
        raise PrismError(f"steps: must be at least 1, got {steps}")
    if steps is not None and recorded_steps is not None and steps > recorded_steps:
        raise PrismError(f"steps: {steps} is past the recording, which has {recorded_steps} steps (the recorded "
                         f"job's --steps {recorded_steps}); emulate at most {recorded_steps}, or record the job "
                         f"with more steps")


def _worker_spec(job: JobConfig, rank: int, *, present: tuple[int, ...], store_addr: str, out_dir: Path,
                 timeout_s: float, engine_options: dict[str, str], origin_ns: int, workspace: Workspace,
                 profile_dir: str = "", gpu: int | None = None) -> WorkerSpec:
    slot = gpu if gpu is not None else physical_slot(job.device, rank, job.ranks_per_node)
    shim = ShimConfig(rank=rank, world_size=job.world_size, local_rank=slot,
                      ranks_per_node=job.ranks_per_node, device=job.device, store_addr=store_addr,
                      present_ranks=len(present), is_store_leader=rank == present[0], timeout_s=timeout_s,
                      clock_origin_ns=origin_ns, boundary=job.iterations.boundary)
    return WorkerSpec(shim=shim, engine="live",
                      entrypoint=workspace.entrypoint, args=job.args, cwd=workspace.cwd,
                      out_dir=str(out_dir), env=job.rank_env(), engine_options=engine_options,
                      memory_cap_bytes=job.memory_cap_bytes, profile_dir=profile_dir,
                      warmup_steps=job.iterations.warmup, measured_steps=job.iterations.measured)


def _start_store(timeout_s: float) -> tuple[dist.TCPStore, str]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return store, f"{reachable_host()}:{store.port}"


def _supervise(out_dir: Path, job: JobConfig, starts: list[tuple[int, list[str]]], timeout_s: float,
               store: dist.TCPStore, recorded: Callable[[], dict] | None = None) -> None:
    """Run the workers and replayers; ``recorded()`` gives the sandbox ranks' recorded ops
    (``prism.graph.opsig.recorded_ops``), read only when a process fails, to name an op that
    differs from what the virtual ranks replay. A CPU job's processes start from a fork server
    (:mod:`prism.core.forkserver`); a GPU job's afresh (a CUDA context does not survive a fork)."""
    world_size = job.world_size
    env = package_env()
    # The sandbox ranks publish their ops to the store: ranks that disagree on an op stop the run at
    # once, a timeout names every sandbox rank's pending op (prism.core.hangwatch). Replayers
    # (keys >= world_size) walk the graph and publish nothing.
    watcher = HangWatcher(store, [key for key, _ in starts if key < world_size], timeout_s=timeout_s)
    slot_of = {key: i for i, key in enumerate(sorted(k for k, _ in starts if k < world_size))}
    preload = (WORKER_MODULE, REPLAYER_MODULE) if job.device == "cpu" else ()
    with Supervisor(error_dir=out_dir, log_dir=out_dir / "logs", preload=preload) as sup:
        for key, argv in starts:  # replayer i runs under key world_size + i
            replayer = key >= world_size
            sup.start(key, argv, env, name=f"replayer {key - world_size}" if replayer else "",
                      role="assistant" if replayer else "sandbox", slot=None if replayer else slot_of.get(key))
        try:
            # The timeout is a stall (no sandbox rank issued or completed an op for that long).
            sup.wait_all(timeout_s=math.inf, on_done=watcher.rank_finished, tick=watcher.tick)
        except RankFailedError as e:
            oom = with_ooms(e, out_dir)  # a peer (or a replayer) may fail first on its lost connection
            if oom is not e:
                raise oom from e
            explained = watcher.explain_failure(e, _reference(recorded) if recorded else None,
                                                who=f"replayer {e.rank - world_size}" if e.rank >= world_size else "")
            if explained is not e:
                raise explained from e
            raise


def _reference(recorded: Callable[[], dict]):
    try:
        ops = recorded()
    except PrismError:
        log.debug("no recorded ops to compare with", exc_info=True)
        return None
    return lambda rank, key: ops.get((rank, key))


def emulate(run_dir: str | Path, options: EmulateOptions) -> EmulateResult:
    """Run the sandbox ranks for real and every other rank as a vrank; return per-rank results."""
    run = RunDir(Path(run_dir))
    recorded_job = run.load_job()
    job = with_steps(options.change.apply(recorded_job), options.steps)
    _check_steps(recorded_job, job)
    if options.memory_cap_bytes is not None:
        job = dataclasses.replace(job, memory_cap_bytes=options.memory_cap_bytes)
    if options.clock not in ("", "cosim", "offset"):
        raise PrismError(f"clock: must be 'cosim' or 'offset', got {options.clock!r}")
    if not options.clock:
        options = dataclasses.replace(options, clock="offset" if options.change.is_empty else "cosim")
    if options.num_replayers < 1:
        raise PrismError(f"replayers: must be at least 1, got {options.num_replayers}")
    ranks = tuple(sorted(set(options.ranks)))
    bad = [r for r in ranks if not 0 <= r < job.world_size]
    if not ranks or bad:
        raise PrismError(f"ranks: {list(bad) or 'none'} outside 0-{job.world_size - 1}")
    kind = options.graph_kind or ("bare" if run.graph_dir("bare").is_dir() else "real")
    if not run.graph_dir(kind).is_dir():
        raise RunDirError(f"{run.root}: no graph/{kind} (run prism collect or prism record first)")
    verify_graph(run.graph_dir(kind))  # here, before any process starts, rather than in a replayer
    recorded = Path(options.recorded_dir) if options.recorded_dir else _recorded_for(run, ranks, kind)
    if not recorded.is_dir():
        raise RunDirError(f"{recorded}: no recorded data for sandbox ranks {list(ranks)} or a set that contains "
                          f"them; collect with values.ranks: {','.join(map(str, ranks))} (or derive it from a "
                          f"capture run)")
    check_files(recorded)  # an unfinished or damaged set stops here, before any process starts
    out = (Path(options.out_dir) if options.out_dir else
           run.root / "emulations" / time.strftime("%Y%m%d-%H%M%S") / f"ranks-{'_'.join(map(str, ranks))}")
    out.mkdir(parents=True, exist_ok=True)
    layout = _layout(job, ranks, options)
    log.info("layout: %s", layout.describe())
    once = functools.partial(_emulate_once, run, ranks=ranks, kind=kind, recorded=recorded, layout=layout)
    if options.memory not in ("pass", "inline", "untracked"):
        raise ValueError(f"EmulateOptions.memory must be pass, inline or untracked, got {options.memory!r}")
    if not needs_memory_pass(job) or timed_run_tracked(job, options):
        return once(job, options, out)
    if options.memory == "untracked":
        return once(timed_pass_job(job), options, out)
    memory_out = out / MEMORY_PASS_DIR
    memory_options = dataclasses.replace(options, capture_dir="", profile=False,
                                         phase=options.phase and options.phase + "-memory-pass")
    # The memory pass flags the divergent ops; the timed pass's sends skip that comparison.
    timed_options = dataclasses.replace(options, flag_divergence=False)
    if job.memory_cap_bytes:
        # The tracker enforces the cap, so the tracked pass runs first: a rank above it fails there,
        # at the real run's allocation (as `prism record --memory-cap` does), and that pass is the
        # emulation's result. A run that fits is then timed untracked, like the slices that time
        # its vranks; its allocations are the tracked pass's, so it cannot exceed the cap. The
        # tracked pass keeps --profile too: if it is the result, its profile shows where it stopped.
        try:
            tracked_result = once(memory_pass_job(job), dataclasses.replace(memory_options, profile=options.profile),
                                  memory_out)
        except RankOOMError:
            _promote(memory_out, out)
            raise
        result = once(timed_pass_job(job), timed_options, out)
    else:
        # The timed pass first: a failing script fails there, with its logs where they always were.
        result = once(timed_pass_job(job), timed_options, out)
        tracked_result = once(memory_pass_job(job), memory_options, memory_out)
    for r in ranks:
        with record_path(memory_out, r).open("rb") as f:
            tracked = pickle.load(f)  # noqa: S301 - our own worker's output
        with record_path(out, r).open("rb") as f:
            timed = pickle.load(f)  # noqa: S301
        atomic_write_bytes(record_path(out, r), pickle.dumps(with_tracked_peaks(timed, tracked)))
    return _with_flags_of(result, tracked_result, memory_out)


def _with_flags_of(result: EmulateResult, tracked: EmulateResult, memory_out: Path) -> EmulateResult:
    """The timed pass's result with the memory pass's divergence flags, in its ``live.json`` files too."""
    for r in result.ranks:
        timed_path = _live_path(result.out_dir, r)
        timed = json.loads(timed_path.read_text())
        timed["diverged_ops"] = json.loads(_live_path(memory_out, r).read_text())["diverged_ops"]
        atomic_write_text(timed_path, json.dumps(timed, indent=1))
    ranks = {r: dataclasses.replace(row, diverged_ops=tracked.ranks[r].diverged_ops) for r, row in result.ranks.items()}
    return dataclasses.replace(result, ranks=ranks)


def timed_run_tracked(job: JobConfig, options: EmulateOptions) -> bool:
    """Whether an emulation's timed run is also its tracked one: a CPU job whose peaks come from the
    per-op tracker, run with ``memory="inline"``. Its sandbox ranks' steps then pay the tracker's
    cost per op, which the untracked calibration slices that time the vranks did not. (A capped
    job is tracked first and timed in a second, untracked pass.)"""
    return needs_memory_pass(job) and options.memory == "inline"


def _promote(memory_out: Path, out: Path) -> None:
    """A capped emulation that ran out of memory in its tracked pass: that pass is the result, so
    its records, logs and errors move up into ``out``, where the report reads them."""
    for entry in memory_out.iterdir():
        target = out / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        entry.replace(target)
    memory_out.rmdir()


def _emulate_once(run: RunDir, job: JobConfig, options: EmulateOptions, out: Path, *, ranks: tuple[int, ...],
                  kind: str, recorded: Path, layout: DeviceLayout) -> EmulateResult:
    out.mkdir(parents=True, exist_ok=True)
    # Ranks and replayers wait longer than the hang watcher's stall limit (it explains a stall).
    store, addr = _start_store(rank_timeout_s(options.timeout_s))
    opts = {"sandbox": ",".join(map(str, ranks)), "transport_store": addr, "opwatch": "1",
            "num_replayers": str(options.num_replayers), "recorded_dir": str(recorded),
            "capture_dir": options.capture_dir, "device_path": layout.path,
            "graph_dir": str(run.graph_dir(kind))}
    if options.eager_completion:
        opts["completion"] = "eager"
    if not options.flag_divergence:
        opts["divergence"] = "off"
    # The working directory is a copy of the recorded script's folder; a what-if's changed
    # entrypoint runs from where the user put it, in that working directory.
    source_job = dataclasses.replace(job, entrypoint=run.load_job().entrypoint) if options.change.entrypoint else job
    with isolated_run(source_job, run.root, options.phase or _phase(run, out)) as workspace:
        if options.change.entrypoint:
            workspace.entrypoint = options.change.entrypoint
        launched = time.time()
        origin = time.perf_counter_ns()
        with private_mps() if options.mps else contextlib.nullcontext():
            _run_emulation(job, run, kind, ranks, options, layout, out, opts, store, addr, origin, recorded, workspace)
    wall = time.time() - launched
    del store
    result = _collect_results(out, job.world_size, ranks, options.num_replayers, launched, wall, kind)
    result.extra["layout"] = layout.describe() + ("; private MPS server" if options.mps else "")
    result.extra["outside_writes"] = list(workspace.outside)
    return result


def _phase(run: RunDir, out: Path) -> str:
    try:
        return "emulate/" + str(out.resolve().relative_to(run.root / "emulations")).replace("/", "-")
    except ValueError:
        return f"emulate/{out.name}"


def _run_emulation(job: JobConfig, run: RunDir, kind: str, ranks: tuple[int, ...], options: EmulateOptions,
                   layout: DeviceLayout, out: Path, opts: dict[str, str], store: dist.TCPStore, addr: str,
                   origin: int, recorded: Path, workspace: Workspace) -> None:
    starts = []
    connect = _groups_used(run.graph_dir(kind), ranks)
    for r in ranks:
        path = out / f"spec-{r:05d}.json"
        path.write_text(_worker_spec(job, r, present=ranks, store_addr=addr, out_dir=out,
                                     timeout_s=rank_timeout_s(options.timeout_s), workspace=workspace,
                                     engine_options={**opts, "connect_groups": json.dumps(connect[r])}, origin_ns=origin,
                                     gpu=layout.rank_gpu.get(r),
                                     profile_dir=str(out / PROFILE_DIR) if options.profile else "").to_json())
        starts.append((r, [sys.executable, "-m", WORKER_MODULE, "--spec", str(path)]))
    for i in range(options.num_replayers):
        spec = ReplayerSpec(index=i, num_replayers=options.num_replayers, sandbox=ranks,
                            graph_dir=str(run.graph_dir(kind)), recorded_dir=str(recorded), transport_store=addr,
                            out_dir=str(out), supervisor_key=job.world_size + i, steps=options.steps,
                            timeout_s=rank_timeout_s(options.timeout_s), timed_graph_dir=options.timed_graph_dir,
                            device_path=layout.path, clock=options.clock, warmup_steps=job.iterations.warmup,
                            device_index=layout.replayer_gpu[i] if layout.replayer_gpu else -1)
        path = out / f"replayer-{i:03d}.spec.json"
        path.write_text(spec.to_json())
        starts.append((job.world_size + i, [sys.executable, "-m", REPLAYER_MODULE, "--spec", str(path)]))
    _supervise(out, job, starts, options.timeout_s, store,
               recorded=lambda: recorded_ops(read_graph(run.graph_dir(kind)), ranks))


def _groups_used(graph_dir: Path, ranks: tuple[int, ...]) -> dict[int, list[str]]:
    """The groups each sandbox rank communicates on (size > 1): their transports connect when the
    script creates them (prism.sandbox.engines.live)."""
    graph = read_graph(graph_dir)
    return {r: sorted({n.group_id for n in graph.nodes.get(r, ()) if n.is_comm
                       and len(graph.groups[n.group_id].ranks) > 1}) for r in ranks}


def _layout(job: JobConfig, ranks: tuple[int, ...], options: EmulateOptions) -> DeviceLayout:
    num_gpus = 0
    if options.mps and job.device != "cuda":
        raise PrismError("--mps runs GPU processes under a private MPS server; this job's device is cpu")
    if job.device == "cuda":
        num_gpus = torch.cuda.device_count()
    return device_layout(job.device, num_gpus, ranks, options.num_replayers, path=options.device_path,
                         sandbox_gpus=options.sandbox_gpus, assistant_gpus=options.assistant_gpus)


def _recorded_for(run: RunDir, ranks: tuple[int, ...], kind: str) -> Path:
    """RUN/payloads/pruned/<ranks>; derived once from a larger recorded set if only that exists
    (values.ranks: 0-7 serves an emulation of 2,5)."""
    own = recorded_dir(run.root, ranks)
    if own.is_dir():
        return own
    superset = find_superset_dir(own.parent, ranks)
    if superset is None:
        return own
    log.info("deriving the recorded data of ranks %s from %s", list(ranks), superset.name)
    groups = {gid: g.ranks for gid, g in read_graph(run.graph_dir(kind)).groups.items()}
    return derive_subset(superset, ranks, groups)


def _since(t: float | None, launched: float) -> float | None:
    return None if t is None else t - launched


def _live_path(out: Path, rank: int) -> Path:
    return out / f"rank-{rank:05d}.live.json"  # written by the live engine (prism.sandbox.engines.live)


def _collect_results(out: Path, world_size: int, ranks, num_replayers: int, launched: float, wall: float,
                     kind: str) -> EmulateResult:
    per_rank = {}
    delegated: dict[int, list[dict]] = {}  # the nccl path: the replayers see the divergences
    for i in range(num_replayers):
        for r, ops in json.loads(replayer_result_path(out, i).read_text()).get("diverged_ops", {}).items():
            delegated.setdefault(int(r), []).extend(ops)
    for r in ranks:
        d = json.loads(_live_path(out, r).read_text())
        d["diverged_ops"] = list(d["diverged_ops"]) + delegated.get(r, [])
        per_rank[r] = SandboxRankResult(
            rank=r, losses=tuple(d["losses"]), step_times_ns=tuple(d["step_times_ns"]), num_ops=d["num_ops"],
            diverged_ops=tuple(f"{x['op']} {x['key']}" for x in d["diverged_ops"]),
            num_transports=d["num_transports"], num_connections=d["num_connections"],
            traffic_bytes=d["traffic_bytes"], first_op_done_s=_since(d["first_op_done_unix_s"], launched),
            peak_rss_bytes=d["peak_rss_bytes"], lazy_transports=tuple(d.get("lazy_transports", ())),
        )
    reps = []
    for i in range(num_replayers):
        d = json.loads(replayer_result_path(out, i).read_text())
        reps.append(ReplayerResult(
            index=i, num_channels=d["num_channels"], num_transports=d["num_transports"],
            num_connections=d["num_connections"], num_ops=d["num_ops"],
            num_steps=d["num_steps"], traffic_bytes=d["traffic_bytes"], peak_rss_bytes=d["peak_rss_bytes"],
            first_op_done_s=_since(d["first_op_done_unix_s"], launched),
            num_recorded_outputs=d.get("num_recorded_outputs", 0),
            num_transfer_holds=d.get("num_transfer_holds", 0),
        ))
    return EmulateResult(world_size, per_rank, tuple(reps), wall, out, kind)


def captured_losses(run_dir: str | Path, rank: int) -> tuple[float, ...] | None:
    """The losses ``rank`` had in the capture run (whose comm values are the recorded ones), or None
    when RUN/capture/ has no result for it."""
    path = _live_path(Path(run_dir) / "capture" / "workers", rank)
    return tuple(json.loads(path.read_text())["losses"]) if path.is_file() else None


def capture_job(job: JobConfig, run_dir: str | Path, *, derive_for: tuple[int, ...] = (),
                timeout_s: float = 600.0) -> Path:
    """Run all W ranks as sandbox ranks with prism's ring order and save every rank's comm
    inputs/outputs to RUN/capture/; then derive the recorded data of sandbox set ``derive_for``."""
    run = RunDir(Path(run_dir))
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.job_file.is_file():
        run.save_job(job)
    capture = run.root / "capture"
    out = capture / "workers"
    out.mkdir(parents=True, exist_ok=True)
    store, addr = _start_store(rank_timeout_s(timeout_s))
    origin = time.perf_counter_ns()
    everyone = tuple(range(job.world_size))
    opts = {"sandbox": "all", "transport_store": addr, "capture_dir": str(capture), "opwatch": "1"}
    with isolated_run(job, run.root, "capture") as workspace:
        starts = []
        for r in everyone:
            path = out / f"spec-{r:05d}.json"
            path.write_text(_worker_spec(job, r, present=everyone, store_addr=addr, out_dir=out,
                                         timeout_s=rank_timeout_s(timeout_s), workspace=workspace,
                                         engine_options=opts, origin_ns=origin).to_json())
            starts.append((r, [sys.executable, "-m", WORKER_MODULE, "--spec", str(path)]))
        _supervise(out, job, starts, timeout_s, store)
    del store
    if derive_for:
        derive_from_capture(run.root, capture, derive_for, tree_all_reduce=policy_from_env(job.env).tree_all_reduce)
    return capture
