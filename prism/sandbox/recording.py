"""``prism record``: the real job, all W ranks, every rank under the shim with ``passthrough``.

This is the ground truth every fidelity claim is compared with (DESIGN §10), recorded by the
same recorder that the other modes use.

The recorder must not change the job it records, but the CPU memory tracker costs ~5 µs per aten
op (``bench/memtrack_cost.py``: +20 % per step on moe). So on CPU the job runs twice
(:mod:`prism.graph.memory_pass`): a *memory pass* with the tracker (its peaks, and the memory
cap's enforcement), then the *timed pass* without it, whose nodes, step times and losses are the
recorded graph. Both are real runs of the same program on the same backend, so the peaks are what
a single tracked run reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from prism.core.atomic import atomic_write_text
from prism.core.config import JobConfig
from prism.core.errors import HangError, MismatchError, PrismError, RankFailedError, RankOOMError, crash_site
from prism.core.isolation import isolated_run
from prism.core.rundir import RunDir
from prism.graph.io import write_graph
from prism.graph.memory_pass import (
    SEPARATE_PASS,
    TRACKED_INLINE,
    memory_pass_job,
    needs_memory_pass,
    timed_pass_job,
    with_tracked_peaks,
)
from prism.graph.records import Graph, RankRecord

from .launch import LaunchOptions, assemble_graph, launch_ranks

__all__ = ["record_job", "walk_rank", "failure_summary", "cuda_backend_of", "FAILURE_FILE"]

PAYLOADS_REAL = "payloads_real"
"""RUN/payloads_real/rank-R/: the tensors rank R received in the recorded run (``--payloads``)."""
FAILURE_FILE = "failure.json"
"""Written into the run directory when ``record_job`` stops on a failing rank, a mismatch or a hang."""
_TAIL_LINES = 12

log = logging.getLogger(__name__)


def cuda_backend_of(job: JobConfig, requested: str) -> str:
    """The real backend for CUDA tensors under ``prism record``: ``requested`` on a ``device: cuda``
    job. A CPU job's plain launch runs on gloo alone, so on a host with GPUs its recording must not
    add a ProcessGroupNCCL to every group (with its watchdog and heartbeat threads): that would be
    the recorder's doing, not the job's."""
    return requested if job.device == "cuda" else "gloo"


def record_job(
    job: JobConfig,
    run_dir: str | Path,
    *,
    timeout_s: float = 600.0,
    cuda_backend: str = "nccl",
    on_progress: Callable[[int, int], None] | None = None,
    memory_pass: bool | None = None,
    payloads: bool = False,
    replace: bool = False,
) -> Graph:
    """Run the real job and write RUN/job.yaml and RUN/graph/real/.

    ``memory_pass``: measure the tracked peaks in a separate untimed run (default: on CPU when the
    tracker is in use, see the module's docstring); False tracks them inside the timed run.
    ``payloads``: also keep every tensor each rank received (in the timed pass), in
    RUN/payloads_real/rank-R/ (what ``prism replay --values`` restores).
    ``replace``: RUN may hold a run of another program, whose data is removed (``RunDir.claim``).
    ``cuda_backend``: the real backend for CUDA tensors on a ``device: cuda`` job (``cuda_backend_of``)."""
    run = RunDir(Path(run_dir))
    run.claim(job, replace=replace)
    run.root.mkdir(parents=True, exist_ok=True)
    run.save_job(job)
    failure = run.root / FAILURE_FILE
    failure.unlink(missing_ok=True)
    if memory_pass is None:
        memory_pass = needs_memory_pass(job)
    payload_root = run.root / PAYLOADS_REAL
    shutil.rmtree(payload_root, ignore_errors=True)  # a previous recording's values are not this run's
    options = LaunchOptions(engine="passthrough", timeout_s=timeout_s, cuda_backend=cuda_backend_of(job, cuda_backend),
                            log_dir=str(run.logs),
                            engine_options={"payload_dir": str(payload_root / "rank-{rank}")} if payloads else {})
    if not memory_pass:
        records = _launch(job, options, failure, on_progress, run.root, "record")
    else:
        total = 2 * job.world_size

        def progress(offset: int) -> Callable[[int, int], None] | None:
            return None if on_progress is None else lambda done, _n: on_progress(offset + done, total)

        tracked = _launch(memory_pass_job(job),
                          dataclasses.replace(options, log_dir=str(run.logs / "memory-pass"), engine_options={}),
                          failure, progress(0), run.root, "record-memory-pass")
        records = [with_tracked_peaks(rec, mem) for rec, mem in
                   zip(_launch(timed_pass_job(job), options, failure, progress(job.world_size), run.root, "record"),
                       tracked)]
    graph = assemble_graph(job, records, kind="real")
    if memory_pass:
        graph.meta["memory"] = SEPARATE_PASS
    elif needs_memory_pass(job):
        graph.meta["memory"] = TRACKED_INLINE  # its step times include the tracker's cost per op
    write_graph(graph, run.graph_dir("real"))
    log.info("recorded %d ranks of %s into %s", job.world_size, job.name, run.graph_dir("real"))
    return graph


def _launch(job: JobConfig, options: LaunchOptions, failure: Path, on_progress: Callable[[int, int], None] | None,
            run_root: Path, phase: str) -> list[RankRecord]:
    """One run of the script in a working directory of its own (``prism.core.isolation``)."""
    try:
        with isolated_run(job, run_root, phase, refresh=True) as workspace:
            return launch_ranks(job, dataclasses.replace(options, workspace=workspace), on_progress=on_progress)
    except RankFailedError as e:
        atomic_write_text(failure, json.dumps(failure_summary(e), indent=1))
        raise
    except (MismatchError, HangError) as e:
        lines = str(e).splitlines()
        atomic_write_text(failure, json.dumps({"kind": "mismatch" if isinstance(e, MismatchError) else "hang",
                                               "error": lines[0], "report": lines[1:]}, indent=1))
        raise


def failure_summary(error: RankFailedError) -> dict:
    """RUN/failure.json: which rank failed and how; ``ooms`` lists every rank that ran out of memory
    (rank, step, requested bytes, cap, bytes in use, message)."""
    lines = error.traceback_text.strip().splitlines()
    is_oom = isinstance(error, RankOOMError)
    return {
        "rank": error.rank,
        "kind": "oom" if is_oom else "error",
        "exit_code": error.exit_code,
        "error": error.oom.message.splitlines()[0] if is_oom else crash_site(error.traceback_text).error,
        "traceback_tail": lines[-_TAIL_LINES:],
        "ooms": [dataclasses.asdict(o) for o in getattr(error, "ooms", ())],
    }


def walk_rank(job: JobConfig, rank: int, *, engine: str = "fake", timeout_s: float = 600.0,
              run_dir: str | Path | None = None) -> RankRecord:
    """Run logical rank ``rank`` alone (no peers) under ``engine``; return what it did. It runs in a
    working directory of its own: its outputs go to RUN/outputs/walk-<engine>-r<rank> with
    ``run_dir``, else nowhere (a temporary run directory)."""
    if not 0 <= rank < job.world_size:
        raise PrismError(f"rank {rank} is outside 0-{job.world_size - 1}")
    with contextlib.ExitStack() as stack:
        root = run_dir if run_dir is not None else stack.enter_context(tempfile.TemporaryDirectory(prefix="prism-walk-"))
        workspace = stack.enter_context(isolated_run(job, root, f"walk-{engine}-r{rank}"))
        (record,) = launch_ranks(job, LaunchOptions(engine=engine, ranks=(rank,), timeout_s=timeout_s,
                                                    workspace=workspace))
    return record
