"""Peak memory of one rank.

* CUDA: ``torch.cuda.max_memory_allocated`` — exact, comparable between runs.
* CPU (default): the tracked storage peak of :class:`~prism.sandbox.memtrack.StoragePeakTracker`
  — every tensor storage created through the dispatcher, counted until freed; deterministic.
* CPU with ``PRISM_MEMORY=rss``: the process's peak resident set size (``ru_maxrss``), which
  includes the interpreter and torch itself and varies by a few MiB between runs; no overhead.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys

import torch

from .memtrack import StoragePeakTracker

__all__ = ["MemoryMeter"]


class MemoryMeter:
    """Chooses how to measure, wraps the script's run, reports (bytes, source)."""

    def __init__(self, device: str) -> None:
        self.device = device
        mode = os.environ.get("PRISM_MEMORY", "tracked")
        if mode not in ("tracked", "rss"):
            raise ValueError(f"PRISM_MEMORY must be 'tracked' or 'rss', got {mode!r}")
        self._tracker = StoragePeakTracker() if device == "cpu" and mode == "tracked" else None

    def measuring(self):
        return self._tracker if self._tracker is not None else contextlib.nullcontext()

    def peak(self) -> tuple[int, str]:
        if self.device == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated()), "cuda.max_memory_allocated"
        if self._tracker is not None:
            return self._tracker.peak_bytes, "cpu.tracked_storage_peak"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024), "cpu.peak_rss"
