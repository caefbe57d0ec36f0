"""A rank worker: one OS process that runs the user's entrypoint as one logical rank.

``python -m prism.sandbox.worker --spec SPEC.json`` (the launcher writes the spec). On success the
rank's record is pickled to ``<out>/rank-<R>.pkl``; on failure its traceback goes to
``<out>/rank-<R>.error`` and the process exits with code 1, so the launcher can stop the run and
show it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import pickle
import sys
import traceback
from pathlib import Path

from prism.core.affinity import pin_rank
from prism.core.atomic import atomic_write_bytes, atomic_write_text
from prism.core.cprofile import profiled
from prism.core.config import MOE_ROUTER_ENV
from prism.core.workerspec import WorkerSpec, error_path, oom_path, record_path
from prism.graph.records import RankRecord

from . import backend as pg_backend
from . import opwatch
from .engines.base import ENGINE_NAMES, CommEngine
from .memory import MemoryMeter
from .moe_router import install_router
from .profiling import RankProfiler
from .shim import install, run_entrypoint

__all__ = ["make_engine", "run_rank", "main"]

log = logging.getLogger(__name__)


def make_engine(spec: WorkerSpec) -> CommEngine:
    engine = _make_engine(spec)
    payload_dir = spec.engine_options.get("payload_dir")
    if payload_dir:
        from .engines.payload_tap import PayloadTap

        engine = PayloadTap(engine, payload_dir.replace("{rank}", str(spec.shim.rank)), spec.shim.rank)
    return engine


def _make_engine(spec: WorkerSpec) -> CommEngine:
    name, cuda_backend, timeout_s = spec.engine, spec.cuda_backend, spec.shim.timeout_s
    if name == "fake":
        from .engines.fake import FakeEngine

        return FakeEngine()
    if name == "passthrough":
        from .engines.passthrough import PassthroughEngine

        return PassthroughEngine(cuda_backend=cuda_backend, timeout_s=timeout_s)
    if name == "torch-fake":
        from .engines.torchfake import TorchFakeEngine

        return TorchFakeEngine()
    if name == "coordinator":
        from .engines.coordinator import CoordinatorEngine

        opts = spec.engine_options
        return CoordinatorEngine(address=opts["address"], token=opts.get("token", ""), rank=spec.shim.rank)
    if name == "live":
        from .engines.live import LiveEngine

        opts = spec.engine_options
        sandbox = opts.get("sandbox", "all")
        return LiveEngine(
            rank=spec.shim.rank,
            world_size=spec.shim.world_size,
            sandbox=None if sandbox == "all" else [int(r) for r in sandbox.split(",")],
            transport_store=opts["transport_store"],
            num_replayers=int(opts.get("num_replayers", "1")),
            recorded_dir=opts.get("recorded_dir") or None,
            out_dir=spec.out_dir,
            capture_dir=opts.get("capture_dir") or None,
            timeout_s=timeout_s,
            device_path=opts.get("device_path", "host"),
            device_index=spec.shim.local_rank,
            graph_dir=opts.get("graph_dir") or None,
            connect_groups=json.loads(opts.get("connect_groups") or "[]"),
            eager_completion=opts.get("completion") == "eager",
            flag_divergence=opts.get("divergence") != "off",
        )
    if name == "recorded":
        from .engines.recorded import RecordedEngine, ReplayOptions

        return RecordedEngine(ReplayOptions.from_engine_options(
            spec.engine_options, rank=spec.shim.rank, ranks_per_node=spec.shim.ranks_per_node))
    if name in ENGINE_NAMES:
        raise ValueError(f"comm engine {name!r} is not available in this build")
    raise ValueError(f"unknown comm engine {name!r} (known: {', '.join(ENGINE_NAMES)})")


def _observe_other_groups(recorder) -> None:
    """Tell the recorder about groups this rank is not a member of: c10d names every group on
    every rank, and DP templates need those names to rename a template's groups."""
    from torch.distributed import distributed_c10d as c10d

    from prism.graph.records import GroupInfo

    helper = c10d._new_process_group_helper

    @functools.wraps(helper)
    def observing(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs):
        if (group_rank is None or group_rank < 0) and global_ranks_in_group:
            recorder.on_other_group(GroupInfo(str(group_name), tuple(global_ranks_in_group),
                                              str(kwargs.get("group_desc") or "")))
        return helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs)

    c10d._new_process_group_helper = observing


def run_rank(spec: WorkerSpec) -> RankRecord:
    """Install the sandbox, run the script, return the record. Raises what the script raises."""
    os.environ.update(spec.env)
    pin_rank(spec.shim.rank)
    engine = make_engine(spec)
    sandbox = install(spec.shim, engine)
    if spec.observe_other_groups:
        _observe_other_groups(sandbox.recorder)
    recorder = sandbox.recorder
    if os.environ.get(MOE_ROUTER_ENV):  # the job's moe_router plug-in
        install_router(os.environ[MOE_ROUTER_ENV], rank=spec.shim.rank, out_dir=spec.out_dir,
                       current_step=lambda: recorder.current_step)
    publisher = _publisher(spec, recorder)
    meter = MemoryMeter(spec.shim.device, cap_bytes=spec.memory_cap_bytes, rank=spec.shim.rank,
                        device_index=spec.shim.local_rank, current_step=lambda: recorder.current_step,
                        warmup_steps=spec.warmup_steps, measured_steps=spec.measured_steps)
    recorder.add_step_listener(meter.on_step_end)
    profiler = (RankProfiler(spec.profile_dir, rank=spec.shim.rank, world_size=spec.shim.world_size,
                             device=spec.shim.device) if spec.profile_dir else None)
    max_steps = int(spec.engine_options.get("max_steps", "0"))
    if spec.engine_options.get("debugpy"):
        _wait_for_debugger(spec.engine_options["debugpy"], spec.shim.rank)
    if max_steps > 0:
        recorder.add_step_listener(functools.partial(_stop_after, max_steps))
    try:
        with meter.measuring(), profiler or contextlib.nullcontext():
            try:
                run_entrypoint(spec.entrypoint, spec.args, cwd=spec.cwd)
            except StepLimitReached:
                log.info("rank %d: stopped after %d steps (engine option max_steps)", spec.shim.rank, max_steps)
        if publisher is not None:
            publisher.close(finished=True)
    except BaseException as e:
        if publisher is not None:
            # Before the engine shuts down (which makes peers fail on their lost connections): the
            # launcher then knows which rank failed first, and why.
            clean_exit = isinstance(e, SystemExit) and e.code in (None, 0)
            publisher.close(finished=clean_exit, error="" if clean_exit else (
                f"the script exited with sys.exit({e.code!r})\n" if isinstance(e, SystemExit) else traceback.format_exc()))
        # Leave what this rank knows before its engine shuts down: closing its connections makes
        # peers fail, and the supervisor blames the process whose error file is the oldest.
        try:
            if not isinstance(e, SystemExit):
                atomic_write_text(error_path(spec.out_dir, spec.shim.rank), traceback.format_exc())
            _leave_failure(spec, e, meter, recorder, profiler)
        finally:
            engine.shutdown()
        raise
    engine.shutdown()
    record = _finish(recorder, meter, spec.engine)
    if profiler is not None:
        profiler.export(record)
    return record


def _wait_for_debugger(address: str, rank: int) -> None:
    """``prism replay --debug``: a debugpy listener; the script starts once a client attaches."""
    import debugpy

    host, port = address.rsplit(":", 1)
    debugpy.listen((host, int(port)))
    log.warning("rank %d: debugpy listening on %s (pid %d); waiting for a client", rank, address, os.getpid())
    debugpy.wait_for_client()


class StepLimitReached(BaseException):
    """Raised on the script's thread when the rank has run its ``max_steps`` steps (``prism replay
    --steps N``): a BaseException, so the script's own ``except Exception`` does not swallow it."""


def _stop_after(max_steps: int, steps_done: int) -> None:
    if steps_done >= max_steps:
        raise StepLimitReached(steps_done)


def _finish(recorder, meter: MemoryMeter, engine: str, *, exit_code: int = 0) -> RankRecord:
    peaks = meter.peaks()
    return recorder.finish(peak_memory_bytes=peaks.run_bytes, measured_peak_memory_bytes=peaks.measured_bytes,
                           memory_source=peaks.source, engine=engine, exit_code=exit_code)


def _publisher(spec: WorkerSpec, recorder):
    """Publish every comm op to the launcher's store for its hang watcher, when the launcher
    watches (engine option ``opwatch``: prism's own launchers of ``passthrough`` and ``live`` ranks;
    not under torchrun, whose store nobody drains; collect's coordinator watches by itself)."""
    if not spec.shim.store_addr or spec.engine_options.get(opwatch.ENGINE_OPTION) != "1" or not opwatch.enabled():
        return None
    publisher = opwatch.OpPublisher(spec.shim.store_addr, spec.shim.rank, recorder.comm_node,
                                    timeout_s=spec.shim.timeout_s)
    pg_backend.get_context().watch = publisher
    return publisher


def _leave_failure(spec: WorkerSpec, error: BaseException, meter: MemoryMeter, recorder,
                   profiler: RankProfiler | None) -> None:
    """On OOM: the structured report (``rank-R.oom.json``) and the record so far (its peak, its
    nodes up to the OOM), so that an emulation report can show where it stopped. The profile of a
    failed rank is written too (it shows where it failed)."""
    rank = spec.shim.rank
    oom = meter.oom_report(error)
    if oom is not None:
        atomic_write_text(oom_path(spec.out_dir, rank), oom.to_json())
    if oom is None and profiler is None:
        return
    record = _finish(recorder, meter, spec.engine, exit_code=1)
    if oom is not None:
        atomic_write_bytes(record_path(spec.out_dir, rank), pickle.dumps(record))
    if profiler is not None:
        try:
            profiler.export(record)
        except Exception:
            log.warning("rank %d: could not write the profile", rank, exc_info=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.sandbox.worker")
    parser.add_argument("--spec", required=True, help="path of the worker spec (JSON)")
    ns = parser.parse_args(argv)
    spec = WorkerSpec.from_json(Path(ns.spec).read_text())
    logging.basicConfig(level=os.environ.get("PRISM_LOG_LEVEL", "WARNING"), format=f"[rank{spec.shim.rank}] %(levelname)s %(name)s: %(message)s")
    rank = spec.shim.rank
    try:
        with profiled(f"rank{rank}"):
            record = run_rank(spec)
    except SystemExit as e:
        if e.code in (None, 0):
            log.warning("rank %d: the script called sys.exit(0) before finishing", rank)
            return 0
        atomic_write_text(error_path(spec.out_dir, rank), f"the script exited with sys.exit({e.code!r})\n")
        return 1
    except BaseException:
        if not error_path(spec.out_dir, rank).is_file():  # run_rank wrote it when the script raised
            atomic_write_text(error_path(spec.out_dir, rank), traceback.format_exc())
        return 1
    atomic_write_bytes(record_path(spec.out_dir, rank), pickle.dumps(record))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: backend threads (gloo) must not block or crash the exit.
    os._exit(code)
