"""Where the processes of an emulation run: sandbox ranks on *sandbox GPUs*, replayers (the vranks)
on *assistant GPUs* (PrismLLM §4), and which data path joins them.

* ``nccl``: every replayer has a GPU of its own, apart from every sandbox rank's, and no two
  sandbox ranks share a GPU. A sandbox rank's ops with vranks move device memory over NCCL
  (device-to-device), as the real job's collectives do.
* ``ipc``: no two sandbox ranks share a GPU, but a replayer shares a GPU with a sandbox rank (one
  GPU for one sandbox rank and its replayer, or fewer GPUs than sandbox ranks and replayers). The
  protocol of ``nccl``; a lane whose two ends are on one GPU moves device memory over CUDA IPC
  (:mod:`prism.nccl_patches.ipc_lane`), the others over NCCL. Groups of sandbox ranks only keep
  their real NCCL backend (each on its own GPU).
* ``host``: anything else (two sandbox ranks on one GPU, CPU jobs, or ``--device-path host``):
  the transports are gloo, CUDA tensors are staged through host buffers; sandbox ranks run the
  pruned steps themselves.
* ``lanes``: the protocol of ``nccl`` (ops delegated to the replayer over one ordered lane each)
  on gloo and CPU tensors: on CPU jobs, it tests that protocol without a GPU.

Defaults: with ``G`` GPUs, ``k`` sandbox ranks and ``A`` replayers, sandbox ranks take GPUs
``0 .. G-A-1`` round-robin and replayers the last ``A`` GPUs when ``G - A >= k``; else the sandbox
ranks take GPUs ``0 .. min(G, k)-1`` and the replayers share the last of them (``ipc`` when no two
sandbox ranks share a GPU). On 2 GPUs: sandbox GPU 0, assistant GPU 1 (``nccl``); on 8 GPUs with 2
sandbox ranks and 2 replayers: sandbox GPUs 0, 1 and assistant GPUs 6, 7; on 1 GPU with one
sandbox rank: everything on GPU 0 (``ipc``); on 1 GPU with two: ``host``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PrismError

__all__ = ["DeviceLayout", "device_layout", "DEVICE_PATHS", "DEVICE_DATA_PATHS"]

DEVICE_PATHS = ("auto", "nccl", "ipc", "host", "lanes")
DEVICE_DATA_PATHS = frozenset({"nccl", "ipc", "lanes"})
"""The paths whose ops with vranks are delegated to the replayer over lanes."""


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    path: str
    """``nccl``, ``ipc``, ``host`` or ``lanes`` (see the module docstring)."""
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
        if path in ("nccl", "ipc"):
            raise PrismError(f"device path {path}: the job runs on CPU (device: cpu); use host or lanes")
        return DeviceLayout("lanes" if path == "lanes" else "host", {}, ())
    if path == "lanes":
        raise PrismError("device path lanes is for CPU jobs; a CUDA job takes nccl, ipc or host")
    if num_gpus < 1:
        raise PrismError("the job says device: cuda but this host has no CUDA device")
    for what, gpus in (("sandbox GPUs", sandbox_gpus), ("assistant GPUs", assistant_gpus)):
        bad = [g for g in gpus if not 0 <= g < num_gpus]
        if bad:
            raise PrismError(f"{what}: {bad} outside 0-{num_gpus - 1} (this host has {num_gpus} GPUs)")
    a = max(1, num_replayers)
    if not sandbox_gpus:
        fit = num_gpus - a >= len(sandbox)  # room for every sandbox rank beside the assistant GPUs
        sandbox_gpus = tuple(range(num_gpus - a)) if fit else tuple(range(min(num_gpus, max(1, len(sandbox)))))
    if not assistant_gpus:
        rest = [g for g in range(num_gpus) if g not in sandbox_gpus]
        assistant_gpus = tuple(rest[-a:]) if rest else tuple(sandbox_gpus[-1:])
    rank_gpu = {r: sandbox_gpus[i % len(sandbox_gpus)] for i, r in enumerate(sorted(sandbox))}
    replayer_gpu = tuple(assistant_gpus[i % len(assistant_gpus)] for i in range(num_replayers))
    apart = len(set(rank_gpu.values())) == len(rank_gpu)  # NCCL refuses two ranks on one GPU
    separate = (apart and not set(replayer_gpu) & set(rank_gpu.values())
                and len(set(replayer_gpu)) == len(replayer_gpu))
    if path == "nccl" and not separate:
        raise PrismError(f"device path nccl needs a GPU per sandbox rank and per replayer, apart: sandbox "
                         f"{rank_gpu}, replayers {list(replayer_gpu)} (NCCL refuses two ranks on one GPU; "
                         f"the ipc path lets a replayer share a sandbox rank's GPU)")
    if path == "ipc" and not apart:
        raise PrismError(f"device path ipc needs a GPU per sandbox rank: sandbox {rank_gpu} (groups of "
                         f"sandbox ranks run NCCL among them, and NCCL refuses two ranks on one GPU)")
    if path == "host":
        chosen = "host"
    elif separate and path in ("auto", "nccl"):
        chosen = "nccl"
    else:
        chosen = "ipc" if apart else "host"
    return DeviceLayout(chosen, rank_gpu, replayer_gpu)
