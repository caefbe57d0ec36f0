"""Launch logical ranks as local worker processes and gather their records.

Used by ``prism record`` (all W ranks, ``passthrough``: the real job) and by single-rank walks
(``fake``). The launcher hosts the TCPStore that stands in for torchrun's agent store and starts
one ``prism.sandbox.worker`` process per rank under a :class:`~prism.core.supervise.Supervisor`:
the first rank that fails stops the whole run (its traceback is the error), every worker is
reaped, and workers die with the launcher.
"""

from __future__ import annotations

import datetime
import logging
import math
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from prism.core.config import ROUTER_LOG_GLOB, JobConfig
from prism.core.hosts import LocalHost
from prism.core.supervise import Supervisor, package_env
from prism.core.errors import RankFailedError
from prism.core.hangwatch import HangWatcher, rank_timeout_s
from prism.core.isolation import Workspace
from prism.core.workerspec import (WORKER_MODULE, ShimConfig, WorkerSpec, physical_slot, record_path,
                                   with_ooms)
from prism.graph.records import Graph, RankRecord, merge_groups


__all__ = ["LaunchOptions", "launch_ranks", "assemble_graph", "worker_spec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchOptions:
    engine: str
    ranks: tuple[int, ...] | None = None
    """Logical ranks to run (None = all W)."""
    max_parallel: int = 0
    """How many worker processes may run at once (0 = all). Only for engines whose ranks do not
    talk to each other (``fake``)."""
    timeout_s: float = 600.0
    cuda_backend: str = "nccl"
    log_dir: str | None = None
    engine_options: dict[str, str] = field(default_factory=dict)
    workspace: Workspace | None = None
    """Where the script runs (``prism.core.isolation``); None: in its own folder."""


def worker_spec(job: JobConfig, rank: int, *, engine: str, out_dir: str, store_addr: str = "", alone: bool,
                timeout_s: float = 600.0, cuda_backend: str = "nccl", engine_options: dict[str, str] | None = None,
                local_rank: int | None = None, clock_origin_ns: int = 0,
                workspace: Workspace | None = None) -> WorkerSpec:
    """The spec of one worker of ``job`` (shared by every launcher)."""
    if local_rank is None:
        local_rank = physical_slot(job.device, rank, job.ranks_per_node)
    shim = ShimConfig(
        rank=rank,
        world_size=job.world_size,
        local_rank=local_rank,
        ranks_per_node=job.ranks_per_node,
        device=job.device,
        store_addr=store_addr,
        present_ranks=1 if alone else 0,
        is_store_leader=alone,
        timeout_s=timeout_s,
        clock_origin_ns=clock_origin_ns,
        boundary=job.iterations.boundary,
    )
    return WorkerSpec(
        shim=shim,
        engine=engine,
        entrypoint=workspace.entrypoint if workspace else job.entrypoint if job.is_module else str(job.script_path),
        args=job.args,
        cwd=workspace.cwd if workspace else job.base_dir if job.is_module else str(job.script_path.parent),
        out_dir=out_dir,
        env=job.rank_env(),
        cuda_backend=cuda_backend,
        engine_options=dict(engine_options or {}),
        memory_cap_bytes=job.memory_cap_bytes,
        warmup_steps=job.iterations.warmup,
        measured_steps=job.iterations.measured,
    )


def launch_ranks(
    job: JobConfig,
    options: LaunchOptions,
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[RankRecord]:
    """Run the job's ranks as worker processes; return their records in rank order."""
    ranks = tuple(options.ranks) if options.ranks is not None else tuple(range(job.world_size))
    # Under passthrough the ranks meet in a real store; under any other engine here each worker
    # is alone with an in-process store and completes store barriers for everyone else.
    alone = options.engine != "passthrough"
    if not alone and len(ranks) != job.world_size:
        raise ValueError(f"the passthrough engine runs all {job.world_size} ranks together, not {len(ranks)}")
    work = Path(tempfile.mkdtemp(prefix="prism-launch-"))
    log_dir = Path(options.log_dir) if options.log_dir else work / "logs"
    store = None
    store_addr = ""
    # Watched ranks wait longer than the watcher's stall limit (prism.core.hangwatch.rank_timeout_s).
    rank_timeout = options.timeout_s if alone else rank_timeout_s(options.timeout_s)
    # ... and publish their ops for it (prism.sandbox.opwatch reads the option by its name).
    engine_options = dict(options.engine_options) if alone else {**options.engine_options, "opwatch": "1"}
    if not alone:
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=rank_timeout)
        )
        store_addr = f"127.0.0.1:{store.port}"
    env = package_env()
    pending = list(ranks)
    limit = options.max_parallel or len(ranks)
    finished = 0
    origin = time.perf_counter_ns()

    def start_more(sup: Supervisor) -> None:
        while pending and len(sup.procs) < limit:
            rank = pending.pop(0)
            spec = worker_spec(job, rank, engine=options.engine, out_dir=str(work), store_addr=store_addr, alone=alone,
                               timeout_s=rank_timeout, cuda_backend=options.cuda_backend,
                               engine_options=engine_options, clock_origin_ns=origin, workspace=options.workspace)
            path = work / f"spec-{rank:05d}.json"
            path.write_text(spec.to_json())
            sup.start(rank, [sys.executable, "-m", WORKER_MODULE, "--spec", str(path)], env)

    # The ranks of a real run publish their ops to the store; the watcher stops a mismatch or a
    # deadlock at once and explains a timeout (prism.core.hangwatch).
    watcher = HangWatcher(store, ranks, timeout_s=options.timeout_s) if store is not None else None

    def on_done(rank: int) -> None:
        nonlocal finished
        finished += 1
        if watcher is not None:
            watcher.rank_finished(rank)
        if on_progress:
            on_progress(finished, len(ranks))

    def tick(sup: Supervisor) -> None:
        start_more(sup)
        if watcher is not None:
            watcher.tick()

    try:
        # A recording is one host's run (its store is on loopback), whatever host a caller installed.
        # A CPU job's ranks start from a fork server that imported torch once (prism.core.forkserver).
        preload = (WORKER_MODULE,) if job.device == "cpu" else ()
        with Supervisor(error_dir=work, log_dir=log_dir, host=LocalHost(), preload=preload) as sup:
            start_more(sup)
            try:
                # With a watcher the timeout is a stall: no rank issued or completed an op for that long.
                sup.wait_all(timeout_s=math.inf if watcher is not None else options.timeout_s, on_done=on_done,
                             tick=lambda: tick(sup))
            except RankFailedError as e:
                oom = with_ooms(e, work)
                if oom is not e:
                    raise oom from e
                explained = watcher.explain_failure(e) if watcher is not None else e
                if explained is e:
                    raise
                raise explained from e
        del store
        records = []
        for rank in ranks:
            with open(record_path(work, rank), "rb") as f:
                records.append(pickle.load(f))
        return records
    finally:
        for path in work.glob(ROUTER_LOG_GLOB):  # what the MoE mock router sent, per call: kept with the logs
            log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, log_dir / path.name)
        shutil.rmtree(work, ignore_errors=True)  # specs, records, error files: read above


def assemble_graph(job: JobConfig, records: Sequence[RankRecord], *, kind: str) -> Graph:
    """One graph from per-rank records."""
    groups = merge_groups(records)
    return Graph(
        world_size=job.world_size,
        nodes={rec.rank: tuple(rec.nodes) for rec in records},
        groups=groups,
        summaries={rec.rank: rec.summary for rec in records},
        kind=kind,
        job_name=job.name,
        meta={
            "engine": records[0].engine if records else "",
            # One origin for all ranks: their times are on one clock (one host).
            "clock": "shared" if len({rec.clock_origin_ns for rec in records}) == 1 else "per-rank",
        },
    )
