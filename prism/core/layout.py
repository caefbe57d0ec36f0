"""Where the processes of an emulation run: sandbox ranks on *sandbox GPUs*, replayers (the vranks)
on *assistant GPUs* (PrismLLM §4), and which data path joins them.

* ``nccl``: every replayer has a GPU of its own, apart from every sandbox rank's, and no two
  sandbox ranks share a GPU. A sandbox rank's ops with vranks move device memory over NCCL
  (device-to-device), as the real job's collectives do.
* ``host``: anything else (one GPU for everything, CPU jobs, or ``--device-path host``): the
  transports are gloo, CUDA tensors are staged through host buffers; sandbox ranks run the pruned
  steps themselves.
* ``lanes``: the protocol of ``nccl`` (ops delegated to the replayer over one ordered lane each)
  on gloo and CPU tensors: on CPU jobs, it tests that protocol without a GPU.

Defaults: with ``G`` GPUs, ``k`` sandbox ranks and ``A`` replayers, sandbox ranks take GPUs
``0 .. G-A-1`` round-robin and replayers the last ``A`` GPUs when ``G > A``; with one GPU all share
it (host path). On 2 GPUs: sandbox GPU 0, assistant GPU 1; on 8 GPUs with 2 sandbox ranks and 2
replayers: sandbox GPUs 0, 1 and assistant GPUs 6, 7.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PrismError

__all__ = ["DeviceLayout", "device_layout", "DEVICE_PATHS"]

DEVICE_PATHS = ("auto", "nccl", "host", "lanes")


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    path: str
    """``nccl`` or ``host`` (see the module docstring)."""
    rank_gpu: dict[int, int]
    """Sandbox rank -> physical GPU index (empty on CPU)."""
    replayer_gpu: tuple[int, ...]
    """Replayer index -> physical GPU index (empty on CPU: replayers are CPU processes)."""

    def describe(self) -> str:
        if not self.rank_gpu:
            return "cpu"
        sb = ", ".join(f"rank {r}: cuda:{g}" for r, g in sorted(self.rank_gpu.items()))
        rp = ", ".join(f"replayer {i}: cuda:{g}" for i, g in enumerate(self.replayer_gpu))
        return f"{self.path} data path; {sb}; {rp}"


def device_layout(
    device: str,
    num_gpus: int,
    sandbox: Sequence[int],
    num_replayers: int,
    *,
    path: str = "auto",
    sandbox_gpus: Sequence[int] = (),
    assistant_gpus: Sequence[int] = (),
) -> DeviceLayout:
    """The layout of an emulation (pure: ``num_gpus`` is the host's GPU count)."""
    if path not in DEVICE_PATHS:
        raise PrismError(f"device path: {path!r} is not one of {', '.join(DEVICE_PATHS)}")
    if device != "cuda":
        if path == "nccl":
            raise PrismError("device path nccl: the job runs on CPU (device: cpu); use host or lanes")
        return DeviceLayout("lanes" if path == "lanes" else "host", {}, ())
    if path == "lanes":
        raise PrismError("device path lanes is for CPU jobs; a CUDA job takes nccl or host")
    if num_gpus < 1:
        raise PrismError("the job says device: cuda but this host has no CUDA device")
    for what, gpus in (("sandbox GPUs", sandbox_gpus), ("assistant GPUs", assistant_gpus)):
        bad = [g for g in gpus if not 0 <= g < num_gpus]
        if bad:
            raise PrismError(f"{what}: {bad} outside 0-{num_gpus - 1} (this host has {num_gpus} GPUs)")
    a = max(1, num_replayers)
    if not sandbox_gpus:
        sandbox_gpus = tuple(range(max(1, num_gpus - a)))
    if not assistant_gpus:
        rest = [g for g in range(num_gpus) if g not in sandbox_gpus]
        assistant_gpus = tuple(rest[-a:]) if rest else tuple(sandbox_gpus[-1:])
    rank_gpu = {r: sandbox_gpus[i % len(sandbox_gpus)] for i, r in enumerate(sorted(sandbox))}
    replayer_gpu = tuple(assistant_gpus[i % len(assistant_gpus)] for i in range(num_replayers))
    separate = (len(set(rank_gpu.values())) == len(rank_gpu)
                and not set(replayer_gpu) & set(rank_gpu.values())
                and len(set(replayer_gpu)) == len(replayer_gpu))
    if path == "nccl" and not separate:
        raise PrismError(f"device path nccl needs a GPU per sandbox rank and per replayer, apart: sandbox "
                         f"{rank_gpu}, replayers {list(replayer_gpu)} (NCCL refuses two ranks on one GPU)")
    chosen = "nccl" if path in ("auto", "nccl") and separate else "host"
    return DeviceLayout(chosen, rank_gpu, replayer_gpu)
