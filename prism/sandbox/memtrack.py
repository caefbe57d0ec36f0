"""A tracked allocator peak for CPU tensors (torch 2.13 has no CPU allocator statistics).

A ``TorchDispatchMode`` sees every tensor an op returns; each new storage is counted once, by its
``nbytes``, until the storage is freed (a weak reference to its Python object, which torch keeps
alive exactly as long as the storage lives). The peak is deterministic for a deterministic
program — the same program run twice gives the same bytes — which RSS is not. Storages created
outside the dispatcher (``torch.from_numpy``) and inside a comm backend (:func:`untracked`) are not
counted.

With a cap (the job's ``memory_cap_bytes``), a new storage that would take the tracked bytes above
it is not counted and the op raises ``torch.OutOfMemoryError`` — the class CUDA's allocator raises
— before its result reaches the program, as if the allocation had failed; the result is freed as
the exception unwinds. Only the script's thread (the one that made the tracker) is tracked: gloo's
worker threads run with the mode of the thread that queued the work, and what they allocate is
the backend's, outside the count in record and emulate alike.

Two peaks, as CUDA's allocator keeps them: ``peak_bytes`` over the whole run, and
``window_peak_bytes`` over a window that :meth:`~StoragePeakTracker.open_window` starts (at the
bytes in use then, as ``torch.cuda.reset_peak_memory_stats`` does) and
:meth:`~StoragePeakTracker.close_window` ends: the measured steps, after the warmup.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["StoragePeakTracker", "untracked"]

_backend = threading.local()


class untracked:  # noqa: N801 - used like a function: ``with untracked():``
    """Storages created inside are not counted: a comm backend's own buffers. gloo allocates some
    on the caller's thread (``_allgather_base`` makes a flat temporary as large as its output, alive
    until the work completes); NCCL keeps its buffers outside the allocator, and the ``live``
    engine has none there, so counting them would make the real run's peak depend on the backend
    and on when its works complete. (A class, not a generator: entered once per comm op, it costs
    a fifth of a ``contextlib.contextmanager``.)"""

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        self._before = getattr(_backend, "inside", False)
        _backend.inside = True

    def __exit__(self, *exc) -> None:
        _backend.inside = self._before


class StoragePeakTracker(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Keep Dynamo out of ``__torch_dispatch__`` and what it calls. torch wraps the method in
        ``_disable_dynamo`` (a Python frame and four eval-frame switches per op: 10-15 % of the
        mode's cost per op); marking its code object "skip, recursively" in Dynamo's frame
        evaluator does the same at no cost per call. Where this torch lacks that (other
        versions), torch's wrapper stays."""
        try:
            from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

            code = cls.__dict__["__torch_dispatch__"].__code__
            set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
        except (ImportError, AttributeError, TypeError):  # another torch: its own wrapper
            return True
        return False

    def __init__(self, *, cap_bytes: int = 0, describe: Callable[[], str] = lambda: "") -> None:
        """``cap_bytes``: 0 = no cap. ``describe()`` names the place in the OOM message (rank, step)."""
        super().__init__()
        self._script_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        self.window_peak_bytes = -1
        """Peak since :meth:`open_window` (-1: no window opened yet)."""
        self._window_open = False
        self.cap_bytes = cap_bytes
        self._describe = describe
        self.last_oom: tuple[int, int] | None = None
        """(requested bytes, tracked bytes in use) of the last allocation the cap refused."""

    def open_window(self) -> None:
        """Start the window's peak at the bytes in use now."""
        with self._lock:
            self._window_open = True
            self.window_peak_bytes = self.current_bytes

    def close_window(self) -> None:
        """Stop the window: its peak stays as it is."""
        with self._lock:
            self._window_open = False

    def _release(self, key: int) -> None:
        with self._lock:
            nbytes = self._live.pop(key, 0)
            self._refs.pop(key, None)
            self.current_bytes -= nbytes

    def _track(self, t: torch.Tensor) -> None:
        # is_cpu is false for meta and CUDA tensors (and costs 50 ns where device.type costs 250).
        if not t.is_cpu or type(t) is not torch.Tensor:
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = storage._cdata
        if nbytes == 0 or key in self._live:
            return
        with self._lock:
            in_use = self.current_bytes
            refused = bool(self.cap_bytes) and in_use + nbytes > self.cap_bytes
            if refused:
                self.last_oom = (nbytes, in_use)
            else:
                self._live[key] = nbytes
                self._refs[key] = weakref.ref(storage, lambda _r, k=key: self._release(k))
                self.current_bytes += nbytes
                if self.current_bytes > self.peak_bytes:
                    self.peak_bytes = self.current_bytes
                if self._window_open and self.current_bytes > self.window_peak_bytes:
                    self.window_peak_bytes = self.current_bytes
        if refused:
            where = self._describe()
            raise torch.OutOfMemoryError(
                f"CPU out of memory (prism memory cap){' on ' + where if where else ''}: tried to allocate "
                f"{nbytes} bytes with {in_use} bytes tracked in use; cap {self.cap_bytes} bytes "
                f"({self.cap_bytes - in_use} bytes free)")

    def _track_all(self, items) -> None:
        for item in items:
            if isinstance(item, torch.Tensor):
                self._track(item)
            elif type(item) in (tuple, list):
                self._track_all(item)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # A comm backend's threads inherit the mode (ProcessGroupGloo restores the caller's
        # thread-local state in its workers), but what they allocate is the backend's.
        if threading.get_ident() != self._script_thread or getattr(_backend, "inside", False):
            return out
        # An op returns a tensor, a (nested) tuple/list of them, a scalar or None; walked by hand:
        # pytree's tree_leaves costs 0.4 µs for one tensor, 2 µs for three.
        if type(out) is torch.Tensor:
            self._track(out)
        elif type(out) in (tuple, list):
            self._track_all(out)
        elif not isinstance(out, (int, float, bool, complex, type(None))):
            self._track_all(tree_leaves(out))
        return out
