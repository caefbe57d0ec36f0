"""A tracked allocator peak for CPU tensors (torch 2.13 has no CPU allocator statistics).

A ``TorchDispatchMode`` sees every tensor an op returns; each new storage is counted once, by its
``nbytes``, until the storage is freed (a weak reference to its Python object, which torch keeps
alive exactly as long as the storage lives). The peak is deterministic for a deterministic
program — the same program run twice gives the same bytes — which RSS is not. Storages created
outside the dispatcher (``torch.from_numpy``, buffers inside a comm backend) are not counted.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["StoragePeakTracker"]


class StoragePeakTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def _release(self, key: int) -> None:
        with self._lock:
            nbytes = self._live.pop(key, 0)
            self._refs.pop(key, None)
            self.current_bytes -= nbytes

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_meta or type(t) is not torch.Tensor:
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = storage._cdata
        if nbytes == 0 or key in self._live:
            return
        with self._lock:
            self._live[key] = nbytes
            self._refs[key] = weakref.ref(storage, lambda _r, k=key: self._release(k))
            self.current_bytes += nbytes
            if self.current_bytes > self.peak_bytes:
                self.peak_bytes = self.current_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out
