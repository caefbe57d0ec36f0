"""What a rank worker process is told to do (written by launchers, read by ``prism.sandbox.worker``).

Lives in core so that every role that starts workers (the local launcher, the collect
coordinator, the emulation launcher) shares it without importing the sandbox.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ShimConfig", "WorkerSpec", "record_path", "error_path", "physical_slot", "WORKER_MODULE"]

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


def physical_slot(device: str, rank: int, ranks_per_node: int) -> int:
    """LOCAL_RANK for a rank launched on this host: the device it runs on. With fewer GPUs than
    ranks, ranks share GPUs round-robin (only gloo can carry several ranks on one GPU)."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError("the job says device: cuda but this host has no CUDA device")
        return rank % count
    return rank % ranks_per_node
