"""``prism collect``: run all W logical ranks of a job on K slots and write the bare graph.

The coordinator serves the run over gRPC, starts a rank worker (``prism.sandbox.worker`` with the
``coordinator`` engine) when the scheduler first grants that rank a slot, and watches the
processes with a :class:`~prism.core.supervise.Supervisor`: a rank that raises stops the run
with its traceback; a state where no rank can run but comm ops wait stops it with a report of
every rank's pending op. On success RUN/graph/bare/ holds the graph and RUN/payloads/ the
recorded values.

With ``templates: dp`` only the template ranks (DP coordinate 0) run; ops whose members do not
all run are decided by the comm-input rules (:mod:`.rules`), and the graph is written as
templates plus the map that expands them into all W ranks (:mod:`prism.graph.templates`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prism.core.atomic import install_directory, make_temp_dir, remove_stale_temporaries
from prism.core.config import JobConfig
from prism.core.errors import PrismError, RankFailedError
from prism.core.hosts import current_process_host
from prism.core.isolation import Workspace, isolated_run
from prism.core.ranks import parse_rank_ranges
from prism.core.rundir import RunDir
from prism.core.supervise import Supervisor, package_env
from prism.core.workerspec import WORKER_MODULE, ShimConfig, WorkerSpec
from prism.graph.io import write_graph
from prism.graph.records import Graph, RankRecord, merge_groups
from prism.graph.templates import build_template_map, dp_permutations, expand
from prism.nccl_patches.algorithms import policy_from_env
from prism.rpc import CoordinatorServer

from .cuda_checkpoint import ContextSwitcher, make_switcher
from .payloads import PayloadPolicy, PayloadStore
from .pruned_data import PrunedDataRecorder
from .recorded import RecordedValues
from .records import assemble_bare_graph, read_record
from .rules import RuleSet
from .state import RunState

__all__ = ["CollectOptions", "CollectProgress", "CollectResult", "collect_job"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectOptions:
    slots: int | None = None
    """K; None = the job's ``slots``."""
    timeout_s: float = 1800.0
    bind: str = ""
    """Where the coordinator listens; "" = loopback, or every interface in a multi-node run."""
    token: str = ""
    """The run's secret that every call must carry; "" = a fresh random one."""
    address: str = ""
    """What workers dial (default: the bound address)."""
    switcher: ContextSwitcher | None = None
    """None = by the job's device (CUDA checkpoint on cuda, counted no-ops on cpu)."""
    stall_report_s: float = 60.0
    """When nothing moves for this long (no comm op submitted or resolved, no rank finished), a
    warning says what every rank is doing (swaps in flight, pending ops); again each period."""


@dataclass(frozen=True, slots=True)
class CollectProgress:
    ranks_finished: int
    world_size: int
    collectives_resolved: int
    num_swaps: int
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class CollectResult:
    graph: Graph
    """Every rank's node list (a DP-templated collection comes back expanded)."""
    wall_s: float
    num_slots: int
    num_context_switches: int
    num_grants: int
    num_collectives: int
    num_p2p: int
    max_active: int
    swaps: dict
    payload_bytes: int
    num_ranks_run: int = 0
    """Ranks that ran (W, or one DP replica with templates)."""
    num_by_rule: int = 0
    """Comm ops (summed over ranks) whose outputs a rule or the filler decided."""

    def as_dict(self) -> dict:
        return {"wall_s": self.wall_s, "num_slots": self.num_slots, "num_context_switches": self.num_context_switches,
                "num_grants": self.num_grants, "num_collectives": self.num_collectives, "num_p2p": self.num_p2p,
                "max_active": self.max_active, "swaps": self.swaps, "payload_bytes": self.payload_bytes,
                "num_ranks_run": self.num_ranks_run, "num_by_rule": self.num_by_rule}


def _spec(job: JobConfig, rank: int, *, out_dir: Path, timeout_s: float, options: dict[str, str],
          workspace: Workspace) -> WorkerSpec:
    shim = ShimConfig(
        rank=rank, world_size=job.world_size,
        # Every slot of a one-device collection is device 0; on CPU the usual node-local index.
        local_rank=0 if job.device == "cuda" else rank % job.ranks_per_node,
        ranks_per_node=job.ranks_per_node, device=job.device,
        store_addr="", present_ranks=1, is_store_leader=True, timeout_s=timeout_s,
        boundary=job.iterations.boundary,
    )
    return WorkerSpec(
        shim=shim, engine="coordinator",
        entrypoint=workspace.entrypoint, args=job.args, cwd=workspace.cwd, out_dir=str(out_dir),
        env=job.rank_env(), cuda_backend="gloo", engine_options=options,
        memory_cap_bytes=job.memory_cap_bytes, observe_other_groups=job.templates == "dp",
        warmup_steps=job.iterations.warmup, measured_steps=job.iterations.measured,
    )


def collect_job(job: JobConfig, run_dir: str | Path, options: CollectOptions | None = None, *,
                on_progress: Callable[[CollectProgress], None] | None = None, replace: bool = False) -> CollectResult:
    """Collect the bare graph of ``job`` into ``run_dir`` (RUN/graph/bare, RUN/payloads). ``replace``: RUN
    may hold a run of another program, whose data is removed (``RunDir.claim``)."""
    options = options or CollectOptions()
    run = RunDir(Path(run_dir))
    if job.comm_inputs.source == "recorded":
        source = Path(job.base_dir) / job.comm_inputs.run
        if source.resolve() == run.root.resolve():
            raise PrismError(f"comm_inputs.run: {source} is the run being written; collect into another directory")
    run.claim(job, replace=replace)
    run.root.mkdir(parents=True, exist_ok=True)
    for directory in (run.root, run.root / "graph", run.payloads):
        remove_stale_temporaries(directory)  # of a collection that was killed
    # Everything is built in a staging directory inside RUN and installed only when the run
    # succeeded: a failed, interrupted or killed collection leaves RUN as it was.
    staging = make_temp_dir(run.root, "collect")
    try:
        with isolated_run(job, run.root, "collect", refresh=True) as workspace:
            result = _collect(job, run, staging, options, on_progress, workspace)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("collected %d of %d ranks of %s on %d slots in %.1f s", result.num_ranks_run, job.world_size, job.name,
             result.num_slots, result.wall_s)
    return result


def _collect(job: JobConfig, run: RunDir, staging: Path, options: CollectOptions,
             on_progress: Callable[[CollectProgress], None] | None, workspace: Workspace) -> CollectResult:
    perms = _replicas(job)
    ranks = tuple(r for r in range(job.world_size) if r == min(p[r] for p in perms)) if perms else None
    # More slots than ranks that run would stay empty; the report says how many were used.
    num_slots = min(options.slots or job.slots, len(ranks) if ranks else job.world_size)
    switcher = options.switcher or make_switcher(job.device)
    store = PayloadStore(staging / "payloads")
    store.directory.mkdir()
    recorded = RecordedValues(Path(job.base_dir) / job.comm_inputs.run) if job.comm_inputs.source == "recorded" else None
    # PrunedDataRecorder writes under <its root>/payloads/pruned, here staging/payloads/pruned.
    pruned = (PrunedDataRecorder(staging, parse_rank_ranges(job.values.ranks, job.world_size),
                                 tree_all_reduce=policy_from_env(job.env).tree_all_reduce)
              if job.values.ranks and job.values.record != "none" else None)
    rules = None
    if job.comm_inputs.source == "rules" or perms:
        rules = RuleSet(job.comm_inputs, base_dir=job.base_dir, world_size=job.world_size,
                        small_max_bytes=job.values.small_max_bytes)
    state = RunState(job.world_size, num_slots, switcher=switcher, payloads=store,
                     policy=PayloadPolicy.from_config(job.values, job.world_size), recorded=recorded, pruned=pruned,
                     ranks=ranks, rules=rules, rules_first=job.comm_inputs.source == "rules")
    work = staging / "work"
    work.mkdir()
    host = current_process_host()
    token = options.token or secrets.token_urlsafe(24)
    server = CoordinatorServer(state, bind=options.bind or ("0.0.0.0:0" if host.multi_node else "127.0.0.1:0"),
                               token=token, max_workers=job.world_size + 16)
    address = options.address or (f"{host.reachable_host}:{server.port}" if host.multi_node else server.address)
    engine_options = {"address": address, "token": token}
    env = package_env()
    started = time.monotonic()
    deadline = started + options.timeout_s
    mark, moved_at, reported_at = state.progress_mark(), started, started
    try:
        # A CPU job's ranks start from a fork server that imported torch once (prism.core.forkserver).
        preload = (WORKER_MODULE,) if job.device == "cpu" else ()
        with Supervisor(error_dir=work, log_dir=run.logs, preload=preload) as sup:
            while not state.all_finished():
                for rank, slot in state.take_spawns():
                    path = work / f"spec-{rank:05d}.json"
                    path.touch(mode=0o600)  # it holds the run's token (a shared file system in a multi-node run)
                    path.write_text(_spec(job, rank, out_dir=work, timeout_s=options.timeout_s,
                                          options=engine_options, workspace=workspace).to_json())
                    sup.start(rank, [sys.executable, "-m", WORKER_MODULE, "--spec", str(path)], env, slot=slot)
                _poll(sup, state)
                if state.error is not None:
                    raise state.error
                err = state.check_deadlock()
                if err is not None:
                    raise err
                if on_progress:
                    on_progress(CollectProgress(state.num_finished(), len(state.ranks), state.stats.num_collectives,
                                                switcher.stats.num_swaps_out, time.monotonic() - started))
                now = time.monotonic()
                if (m := state.progress_mark()) != mark:
                    mark, moved_at = m, now
                elif now - max(moved_at, reported_at) >= options.stall_report_s:
                    reported_at = now
                    log.warning("%s", state.stall_report(now - moved_at))
                if time.monotonic() > deadline:
                    raise PrismError(f"collect timed out after {options.timeout_s:.0f} s\n"
                                     + state.pending_report())
                time.sleep(0.02)
    finally:
        state.stop("the run was stopped")
        server.stop()
    wall_s = time.monotonic() - started
    records = [read_record(work, r) for r in state.ranks]
    store.write_index()
    if pruned is not None:
        pruned.close()
    meta = {"slots": str(num_slots), "num_context_switches": str(state.stats.num_context_switches),
            "switcher": switcher.kind, "comm_inputs": job.comm_inputs.source}
    graph = assemble_bare_graph(job, records, store=store, meta=meta)
    if perms:
        graph = _templated(graph, perms, records)
    write_graph(graph, staging / "bare")
    _install(run, job, staging)
    graph = expand(graph)
    return CollectResult(
        graph=graph, wall_s=wall_s, num_slots=num_slots, num_context_switches=state.stats.num_context_switches,
        num_grants=state.stats.num_grants, num_collectives=state.stats.num_collectives,
        num_p2p=state.stats.num_p2p, max_active=state.max_active, swaps=switcher.stats.as_dict(),
        payload_bytes=store.num_bytes_written, num_ranks_run=len(state.ranks), num_by_rule=state.stats.num_by_rule,
    )


def _install(run: RunDir, job: JobConfig, staging: Path) -> None:
    """Install the job, payloads and bare graph of a finished collection. The old bare graph goes
    first and the new one comes last, so RUN never pairs a graph with another run's payloads:
    a kill in between leaves no bare graph (the collection did not finish)."""
    bare = run.graph_dir("bare")
    if bare.exists():
        os.replace(bare, staging / "old-bare")
    run.save_job(job)
    install_directory(staging / "payloads", run.payloads)
    install_directory(staging / "bare", bare)


def _replicas(job: JobConfig) -> list[tuple[int, ...]] | None:
    """With ``templates: dp``: the permutation of the world per DP replica (see prism.graph.templates)."""
    if job.templates != "dp":
        return None
    p = job.parallelism
    assert p is not None  # checked when the job was loaded
    return dp_permutations({"pp": p.pp, "dp": p.dp, "cp": p.cp, "tp": p.tp}, p.mesh)


def _templated(graph: Graph, perms: list[tuple[int, ...]], records: list[RankRecord]) -> Graph:
    used = {n.group_id for nodes in graph.nodes.values() for n in nodes if n.group_id}
    template_groups = [g for gid, g in graph.groups.items() if gid in used]
    known = list(merge_groups(records).values()) + [g for rec in records for g in rec.other_groups]
    tmap, groups = build_template_map(perms, template_groups, known)
    meta = {**graph.meta, "templates": "dp", "num_replicas": str(len(perms))}
    return dataclasses.replace(graph, groups={**graph.groups, **groups}, templates=tmap, meta=meta)


def _poll(sup: Supervisor, state: RunState) -> None:
    try:
        done = sup.poll()
    except RankFailedError as e:
        if state.error is not None:  # the rank died of the run's error: report the cause
            raise state.error from e
        raise
    for rank in done:
        state.on_exit(rank)
