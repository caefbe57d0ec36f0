"""A rank worker: one OS process that runs the user's entrypoint as one logical rank.

``python -m prism.sandbox.worker --spec SPEC.json`` (the launcher writes the spec). On success the
rank's record is pickled to ``<out>/rank-<R>.pkl``; on failure its traceback goes to
``<out>/rank-<R>.error`` and the process exits with code 1, so the launcher can stop the run and
show it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from prism.core.atomic import atomic_write_bytes, atomic_write_text

from .engines.base import ENGINE_NAMES, CommEngine
from .memory import MemoryMeter
from .recorder import RankRecord
from .shim import ShimConfig, install, run_entrypoint

__all__ = ["WorkerSpec", "make_engine", "run_rank", "record_path", "error_path"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    shim: ShimConfig
    engine: str
    entrypoint: str
    args: tuple[str, ...] = ()
    cwd: str = "."
    out_dir: str = "."
    env: dict[str, str] = field(default_factory=dict)
    cuda_backend: str = "nccl"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> WorkerSpec:
        data = json.loads(text)
        data["shim"] = ShimConfig(**data["shim"])
        data["args"] = tuple(data["args"])
        return WorkerSpec(**data)


def record_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank:05d}.pkl"


def error_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank:05d}.error"


def make_engine(name: str, *, cuda_backend: str = "nccl", timeout_s: float = 300.0) -> CommEngine:
    if name == "fake":
        from .engines.fake import FakeEngine

        return FakeEngine()
    if name == "passthrough":
        from .engines.passthrough import PassthroughEngine

        return PassthroughEngine(cuda_backend=cuda_backend, timeout_s=timeout_s)
    if name in ENGINE_NAMES:
        raise ValueError(f"comm engine {name!r} is not available in this build")
    raise ValueError(f"unknown comm engine {name!r} (known: {', '.join(ENGINE_NAMES)})")


def run_rank(spec: WorkerSpec) -> RankRecord:
    """Install the sandbox, run the script, return the record. Raises what the script raises."""
    os.environ.update(spec.env)
    engine = make_engine(spec.engine, cuda_backend=spec.cuda_backend, timeout_s=spec.shim.timeout_s)
    sandbox = install(spec.shim, engine)
    meter = MemoryMeter(spec.shim.device)
    try:
        with meter.measuring():
            run_entrypoint(spec.entrypoint, spec.args, cwd=spec.cwd)
    finally:
        engine.shutdown()
    peak, source = meter.peak()
    return sandbox.recorder.finish(peak_memory_bytes=peak, memory_source=source, engine=spec.engine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.sandbox.worker")
    parser.add_argument("--spec", required=True, help="path of the worker spec (JSON)")
    ns = parser.parse_args(argv)
    spec = WorkerSpec.from_json(Path(ns.spec).read_text())
    logging.basicConfig(level=os.environ.get("PRISM_LOG_LEVEL", "WARNING"), format=f"[rank{spec.shim.rank}] %(levelname)s %(name)s: %(message)s")
    rank = spec.shim.rank
    try:
        record = run_rank(spec)
    except SystemExit as e:
        if e.code in (None, 0):
            log.warning("rank %d: the script called sys.exit(0) before finishing", rank)
            return 0
        atomic_write_text(error_path(spec.out_dir, rank), f"the script exited with sys.exit({e.code!r})\n")
        return 1
    except BaseException:
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
