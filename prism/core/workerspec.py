"""What a rank worker process is told to do (written by launchers, read by ``prism.sandbox.worker``).

Lives in core so that every role that starts workers (the local launcher, the collect
coordinator, the emulation launcher) shares it without importing the sandbox.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PrismError, RankFailedError, RankOOMError

__all__ = ["ShimConfig", "WorkerSpec", "OomReport", "record_path", "error_path", "oom_path", "read_ooms",
           "with_ooms", "physical_slot", "WORKER_MODULE"]

WORKER_MODULE = "prism.sandbox.worker"


@dataclass(frozen=True, kw_only=True, slots=True)
class ShimConfig:
    rank: int
    world_size: int
    local_rank: int = 0
    """Physical device index of this slot (scripts pick their device with LOCAL_RANK)."""
    ranks_per_node: int = 8
    device: str = "cpu"
    store_addr: str = ""
    """``host:port`` of a TCPStore that some leader hosts; empty for an in-process HashStore."""
    present_ranks: int = 0
    """How many logical ranks really run with this store (0 = all W). Store barriers are completed
    on behalf of the others by the leader."""
    is_store_leader: bool = False
    timeout_s: float = 300.0
    clock_origin_ns: int = 0
    """Origin of recorded times on the host's monotonic clock (0: the rank's own start). Ranks
    launched on one host share it, which makes their times comparable."""
    boundary: str = ""
    """The job's ``iterations.boundary`` (empty: none)."""


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
    engine_options: dict[str, str] = field(default_factory=dict)
    """Engine-specific settings (e.g. the coordinator's address)."""
    memory_cap_bytes: int = 0
    """Per-rank memory cap (0: none): CPU tracked storage bytes, or the CUDA caching allocator's limit."""
    profile_dir: str = ""
    """If set, the script runs under ``torch.profiler`` and its Chrome trace goes to
    ``<profile_dir>/rank<R>.json``."""
    warmup_steps: int = 0
    """The job's ``iterations.warmup``: the measured peak starts when this many steps have ended."""
    measured_steps: int = 0
    """The job's ``iterations.measured``: the measured peak ends with them (0: at the run's end)."""
    observe_other_groups: bool = False
    """Record the groups this rank is not a member of too (DP templates rename groups with them;
    at W=65,536 a 3-D mesh makes ~65k of them, so only collections with templates ask)."""

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


def oom_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank:05d}.oom.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class OomReport:
    """A rank that ran out of memory (written by the worker beside its error file)."""

    rank: int
    step: int
    """The iteration it was in (0-based; the steps it finished before the failure)."""
    requested_bytes: int
    """The allocation that failed (-1: unknown)."""
    cap_bytes: int
    """The cap in force (0: none, the device itself ran out)."""
    in_use_bytes: int
    """Bytes in use when it failed: tracked storages (CPU) or ``cuda.memory_allocated`` (-1: unknown)."""
    device: str
    message: str
    """The exception's text (``torch.OutOfMemoryError``)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> OomReport:
        return OomReport(**json.loads(text))


def read_ooms(out_dir: str | Path) -> list[OomReport]:
    """Every OOM report the workers of ``out_dir`` left, in rank order."""
    return [OomReport.from_json(p.read_text()) for p in sorted(Path(out_dir).glob("rank-*.oom.json"))]


def with_ooms(error: RankFailedError, out_dir: str | Path) -> RankFailedError:
    """``error`` as a :class:`RankOOMError` when workers of ``out_dir`` ran out of memory (the first
    process to fail may be a peer that lost its connection to the rank that ran out)."""
    ooms = read_ooms(out_dir)
    if not ooms or isinstance(error, RankOOMError):
        return error
    first = next((o for o in ooms if o.rank == error.rank), ooms[0])
    text = error.traceback_text
    if first.rank != error.rank:
        err = error_path(out_dir, first.rank)
        text = err.read_text() if err.is_file() else first.message
    return RankOOMError(first.rank, text, ooms=tuple(ooms), exit_code=error.exit_code)


def physical_slot(device: str, rank: int, ranks_per_node: int) -> int:
    """LOCAL_RANK for a rank launched on this host: the device it runs on. With fewer GPUs than
    ranks, ranks share GPUs round-robin (only gloo can carry several ranks on one GPU)."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise PrismError("the job says device: cuda but this host has no CUDA device")
        return rank % count
    return rank % ranks_per_node
