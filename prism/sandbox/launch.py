"""Launch logical ranks as local worker processes and gather their records.

Used by ``prism record`` (all W ranks, ``passthrough``: the real job) and by single-rank walks
(``fake``). The launcher hosts the TCPStore that stands in for torchrun's agent store, starts one
``prism.sandbox.worker`` process per rank, and watches them: the first rank that fails stops the
whole run (its traceback is the error), every worker is reaped, and workers die with the launcher
(PR_SET_PDEATHSIG, set between fork and exec), so no orphan survives.
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from prism.core.config import JobConfig
from prism.core.errors import RankFailedError
from prism.graph.records import Graph, GroupInfo

from .recorder import RankRecord
from .shim import ShimConfig
from .worker import WorkerSpec, error_path, record_path

__all__ = ["LaunchOptions", "launch_ranks", "assemble_graph"]

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


def _env_for(job: JobConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update(job.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    # The workers must import this very prism, also from an uninstalled checkout.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _die_with_launcher() -> None:
    """Runs in the child between fork and exec: the kernel kills it when the launcher dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill_all(procs: dict[int, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _failure_text(out_dir: Path, log_dir: Path, rank: int, code: int) -> str:
    err = error_path(out_dir, rank)
    if err.exists():
        return err.read_text()
    log_file = log_dir / f"rank-{rank:05d}.log"
    tail = log_file.read_text(errors="replace")[-4000:] if log_file.exists() else ""
    reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"{reason}; last output:\n{tail}" if tail else reason


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
    entry = job.entrypoint if job.is_module else str(job.script_path)
    cwd = job.base_dir if job.is_module else str(job.script_path.parent)
    work = Path(tempfile.mkdtemp(prefix="prism-launch-"))
    log_dir = Path(options.log_dir) if options.log_dir else work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _env_for(job)
    store = None
    store_addr = ""
    if options.engine == "passthrough":
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=options.timeout_s)
        )
        store_addr = f"127.0.0.1:{store.port}"

    def spec_for(rank: int) -> Path:
        shim = ShimConfig(
            rank=rank,
            world_size=job.world_size,
            local_rank=rank % job.ranks_per_node,
            ranks_per_node=job.ranks_per_node,
            device=job.device,
            store_addr=store_addr,
            present_ranks=1 if alone else 0,
            is_store_leader=alone,
            timeout_s=options.timeout_s,
        )
        spec = WorkerSpec(
            shim=shim, engine=options.engine, entrypoint=entry, args=job.args, cwd=cwd,
            out_dir=str(work), cuda_backend=options.cuda_backend,
        )
        path = work / f"spec-{rank:05d}.json"
        path.write_text(spec.to_json())
        return path

    procs: dict[int, subprocess.Popen] = {}
    logs = []
    pending = list(ranks)
    finished = 0
    limit = options.max_parallel or len(ranks)
    deadline = time.monotonic() + options.timeout_s
    try:
        while pending or procs:
            while pending and len(procs) < limit:
                rank = pending.pop(0)
                log_file = open(log_dir / f"rank-{rank:05d}.log", "wb")  # noqa: SIM115 - closed below
                logs.append(log_file)
                procs[rank] = subprocess.Popen(
                    [sys.executable, "-m", "prism.sandbox.worker", "--spec", str(spec_for(rank))],
                    env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_launcher,
                )
            time.sleep(0.02)
            for rank, p in list(procs.items()):
                code = p.poll()
                if code is None:
                    continue
                del procs[rank]
                if code != 0:
                    text = _failure_text(work, log_dir, rank, code)
                    _kill_all(procs)
                    raise RankFailedError(rank, text, exit_code=code)
                finished += 1
                if on_progress:
                    on_progress(finished, len(ranks))
            if time.monotonic() > deadline:
                stuck = sorted(procs)
                _kill_all(procs)
                raise RankFailedError(stuck[0], f"timed out after {options.timeout_s:.0f} s; ranks still running: {stuck}")
    except BaseException:
        _kill_all(procs)
        raise
    finally:
        for f in logs:
            f.close()
        if store is not None:
            del store
    records = []
    for rank in ranks:
        with open(record_path(work, rank), "rb") as f:
            records.append(pickle.load(f))
    return records


def assemble_graph(job: JobConfig, records: Sequence[RankRecord], *, kind: str) -> Graph:
    """One graph from per-rank records (groups are merged; every rank names the same ids)."""
    groups: dict[str, GroupInfo] = {}
    for rec in records:
        for g in rec.groups:
            known = groups.get(g.group_id)
            if known is None or (not known.desc and g.desc):
                groups[g.group_id] = g
    return Graph(
        world_size=job.world_size,
        nodes={rec.rank: tuple(rec.nodes) for rec in records},
        groups=groups,
        summaries={rec.rank: rec.summary for rec in records},
        kind=kind,
        job_name=job.name,
        meta={"engine": records[0].engine if records else ""},
    )
