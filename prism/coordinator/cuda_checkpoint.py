"""GPU context switching with the CUDA driver's checkpoint API (ctypes; nothing to install).

``cuCheckpointProcessLock`` (RUNNING -> LOCKED), ``cuCheckpointProcessCheckpoint`` (LOCKED ->
CHECKPOINTED: device memory is copied to host and released), ``cuCheckpointProcessRestore``
(-> LOCKED, same virtual addresses) and ``cuCheckpointProcessUnlock`` (-> RUNNING), all called
from the coordinator on the worker's PID (libcuda >= 570, notes/torch-facts.md).

The scheduler calls a :class:`ContextSwitcher` on every slot release (``swap_out``) and grant
(``swap_in``). On CPU it is :class:`NullSwitcher`: no-op calls that are still counted, so the
scheduling logic runs the same way in CI.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import logging
import threading
import time
from dataclasses import dataclass, field

from prism.core.errors import PrismError

__all__ = ["ProcessState", "CudaCheckpoint", "CheckpointError", "ContextSwitcher", "NullSwitcher",
           "CudaSwitcher", "SwapStats", "make_switcher"]

log = logging.getLogger(__name__)

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_TIMEOUT = 909


class ProcessState(enum.IntEnum):
    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


LOCK_TIMEOUT_MS = 120_000


class CheckpointError(RuntimeError):
    def __init__(self, call: str, pid: int, code: int, *, hint: str = "") -> None:
        self.code = code
        super().__init__(f"{call}(pid {pid}) failed with CUresult {code}" + (f" ({hint})" if hint else ""))


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class CudaCheckpoint:
    """Thin bindings of the cuCheckpointProcess* driver calls."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        if lib is None:
            name = ctypes.util.find_library("cuda") or "libcuda.so.1"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise PrismError(f"device: cuda: collecting swaps ranks between slots with the CUDA driver's "
                                 f"checkpoint API, and this host has no CUDA driver ({e})") from None
        self._lib = lib
        for fn in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                   "cuCheckpointProcessUnlock"):
            try:
                f = getattr(lib, fn)
            except AttributeError:
                raise PrismError(f"device: cuda: the CUDA driver has no {fn} (the checkpoint API needs driver "
                                 f">= 570)") from None
            f.argtypes = [ctypes.c_int, ctypes.c_void_p]
            f.restype = ctypes.c_int
        lib.cuCheckpointProcessGetState.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.cuCheckpointProcessGetState.restype = ctypes.c_int
        init = lib.cuInit
        init.argtypes = [ctypes.c_uint]
        init.restype = ctypes.c_int
        code = init(0)
        if code != CUDA_SUCCESS:
            raise CheckpointError("cuInit", 0, code)

    def _call(self, name: str, pid: int, args=None) -> None:
        code = getattr(self._lib, name)(pid, args)
        if code != CUDA_SUCCESS:
            raise CheckpointError(name, pid, code)

    def get_state(self, pid: int) -> ProcessState | None:
        """The process's checkpoint state, or None when it has no CUDA context."""
        state = ctypes.c_int(-1)
        code = self._lib.cuCheckpointProcessGetState(pid, ctypes.byref(state))
        if code != CUDA_SUCCESS:
            return None
        return ProcessState(state.value)

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", pid, ctypes.cast(ctypes.pointer(args), ctypes.c_void_p))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid)


@dataclass
class SwapStats:
    num_swaps_out: int = 0
    num_swaps_in: int = 0
    swap_out_ns: list[int] = field(default_factory=list)
    swap_in_ns: list[int] = field(default_factory=list)
    num_skipped: int = 0
    """Calls for processes without a CUDA context (nothing to move)."""

    def as_dict(self) -> dict:
        def summary(xs: list[int]) -> dict:
            return {"count": len(xs), "total_s": sum(xs) / 1e9, "mean_s": (sum(xs) / len(xs) / 1e9) if xs else 0.0,
                    "max_s": max(xs) / 1e9 if xs else 0.0}

        return {"num_swaps_out": self.num_swaps_out, "num_swaps_in": self.num_swaps_in,
                "num_skipped": self.num_skipped, "swap_out": summary(self.swap_out_ns),
                "swap_in": summary(self.swap_in_ns)}


class ContextSwitcher:
    """Moves a rank's device state off (``swap_out``) and back onto (``swap_in``) its device."""

    kind = "none"
    moves_device_memory = False
    """Ranks hold device memory while they run: a finishing rank keeps its slot until it exits."""

    def __init__(self) -> None:
        self.stats = SwapStats()
        self._lock = threading.Lock()

    def _out(self, pid: int) -> bool:
        return True

    def _in(self, pid: int) -> bool:
        return True

    def swap_out(self, pid: int) -> None:
        t0 = time.perf_counter_ns()
        moved = self._out(pid)
        dt = time.perf_counter_ns() - t0
        with self._lock:
            self.stats.num_swaps_out += 1
            self.stats.swap_out_ns.append(dt) if moved else None
            self.stats.num_skipped += 0 if moved else 1

    def swap_in(self, pid: int) -> None:
        t0 = time.perf_counter_ns()
        moved = self._in(pid)
        dt = time.perf_counter_ns() - t0
        with self._lock:
            self.stats.num_swaps_in += 1
            self.stats.swap_in_ns.append(dt) if moved else None
            self.stats.num_skipped += 0 if moved else 1


class NullSwitcher(ContextSwitcher):
    """CPU: ranks stay in host memory; the calls are counted and timed (about nothing)."""

    kind = "cpu-noop"


class CudaSwitcher(ContextSwitcher):
    """GPU: checkpoint a released rank's CUDA state to host memory, restore it before it runs."""

    kind = "cuda-checkpoint"
    moves_device_memory = True

    def __init__(self, api: CudaCheckpoint | None = None) -> None:
        super().__init__()
        self._api = api or CudaCheckpoint()

    def _out(self, pid: int) -> bool:
        if self._api.get_state(pid) is not ProcessState.RUNNING:
            return False  # no CUDA context yet (or already out)
        try:
            # Locking waits for the process's GPU work to drain; bounded, so a process that cannot
            # be locked stops the collection with its reason instead of stalling it.
            self._api.lock(pid, timeout_ms=LOCK_TIMEOUT_MS)
        except CheckpointError as e:
            if e.code != CUDA_ERROR_TIMEOUT:
                raise
            raise CheckpointError("cuCheckpointProcessLock", pid, e.code,
                                  hint=f"its GPU work did not drain within {LOCK_TIMEOUT_MS // 1000} s") from e
        self._api.checkpoint(pid)
        return True

    def _in(self, pid: int) -> bool:
        state = self._api.get_state(pid)
        if state is ProcessState.CHECKPOINTED:
            self._api.restore(pid)
            state = ProcessState.LOCKED
        if state is ProcessState.LOCKED:
            self._api.unlock(pid)
            return True
        return False


def make_switcher(device: str) -> ContextSwitcher:
    return CudaSwitcher() if device == "cuda" else NullSwitcher()
