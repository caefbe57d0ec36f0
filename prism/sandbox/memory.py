"""Peak memory of one rank, and the job's per-rank memory cap.

* CUDA: ``torch.cuda.max_memory_allocated`` — exact, comparable between runs.
* CPU (default): the tracked storage peak of :class:`~prism.sandbox.memtrack.StoragePeakTracker`
  — every tensor storage created through the dispatcher, counted until freed; deterministic.
* CPU with ``PRISM_MEMORY=rss``: the process's peak resident set size (``ru_maxrss``), which
  includes the interpreter and torch itself and varies by a few MiB between runs; no overhead.

Two peaks per rank (:class:`MemoryPeaks`): the whole run's, and the measured steps' — from the end
of the job's ``iterations.warmup`` steps to the end of its ``iterations.measured`` steps, as the
PrismLLM paper measures (CUDA: ``torch.cuda.reset_peak_memory_stats`` at the warmup boundary, the
window's ``max_memory_allocated`` at its end; CPU tracked: the tracker's window). The recorder
tells the meter where a step ends (:meth:`MemoryMeter.on_step_end`). ``PRISM_MEMORY=rss`` cannot
be reset: its measured peak is unknown (-1).

The cap (``memory_cap_bytes``, docs/job-file.md) makes a rank fail with ``torch.OutOfMemoryError``
where its memory would exceed it. CPU: the tracker refuses the storage that would take the tracked
bytes above the cap (deterministic: the same allocation fails in every run of the same program).
CUDA: ``torch.cuda.set_per_process_memory_fraction(cap / total memory of the device)``, so the
caching allocator itself fails; that limit bounds the bytes the allocator has *reserved* (whole
segments, at least 2 MiB each), which is per process, so ranks that share one GPU each get it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from prism.core.errors import PrismError
from prism.core.workerspec import OomReport

from .memtrack import StoragePeakTracker

__all__ = ["MemoryMeter", "MemoryPeaks", "find_oom"]

log = logging.getLogger(__name__)


def find_oom(exc: BaseException) -> BaseException | None:
    """The ``torch.OutOfMemoryError`` (or host ``MemoryError``) that ``exc`` is or was raised from
    (its cause/context chain)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


@dataclass(frozen=True, slots=True)
class MemoryPeaks:
    run_bytes: int
    """Peak over the whole run (-1: unknown)."""
    measured_bytes: int
    """Peak over the measured steps (-1: unknown: no measured step began, or RSS)."""
    source: str


class MemoryMeter:
    """Chooses how to measure, enforces the cap, wraps the script's run, reports :class:`MemoryPeaks`."""

    def __init__(self, device: str, *, cap_bytes: int = 0, rank: int = 0, device_index: int = 0,
                 current_step: Callable[[], int] = lambda: 0, warmup_steps: int = 0,
                 measured_steps: int = 0) -> None:
        """The measured window opens when ``warmup_steps`` steps have ended (at once for 0) and
        closes when ``warmup_steps + measured_steps`` have (never for ``measured_steps`` 0)."""
        self.device = device
        self.cap_bytes = cap_bytes
        self.rank = rank
        self._device_index = device_index
        self._current_step = current_step
        self._cuda_oom: tuple[int, int] | None = None
        self._warmup_steps = warmup_steps
        self._window_end = warmup_steps + measured_steps if measured_steps else None
        self._window = "before"
        """before | open | closed"""
        self._cuda_before_window = 0
        """CUDA: the run's peak before the window reset the allocator's peak."""
        self._cuda_window_peak = -1
        mode = os.environ.get("PRISM_MEMORY", "tracked")
        if mode not in ("tracked", "rss"):
            raise ValueError(f"PRISM_MEMORY must be 'tracked' or 'rss', got {mode!r}")
        if device == "cpu" and mode == "rss" and cap_bytes:
            raise ValueError(f"memory_cap_bytes={cap_bytes} is enforced on the tracked CPU bytes; "
                             "PRISM_MEMORY=rss cannot enforce it (unset PRISM_MEMORY)")
        self._tracker = (StoragePeakTracker(cap_bytes=cap_bytes, describe=self._where)
                         if device == "cpu" and mode == "tracked" else None)
        if device == "cuda" and cap_bytes:
            self._cap_cuda()
        if warmup_steps == 0:
            self._open_window()

    def _cuda_in_use(self) -> bool:
        return self.device == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized()

    def _open_window(self) -> None:
        self._window = "open"
        if self._tracker is not None:
            self._tracker.open_window()
        if self._cuda_in_use():
            self._cuda_before_window = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    def _close_window(self) -> None:
        self._window = "closed"
        if self._tracker is not None:
            self._tracker.close_window()
        if self._cuda_in_use():
            self._cuda_window_peak = int(torch.cuda.max_memory_allocated())

    def on_step_end(self, steps_done: int) -> None:
        """The recorder's step boundary (on the script's thread): ``steps_done`` steps have ended."""
        if steps_done == self._warmup_steps and self._window == "before":
            self._open_window()
        if steps_done == self._window_end and self._window == "open":
            self._close_window()

    def _where(self) -> str:
        return f"rank {self.rank}, step {self._current_step()}"

    def _cap_cuda(self) -> None:
        if not torch.cuda.is_available():
            raise PrismError("the job says device: cuda but this host has no CUDA device")
        index = self._device_index
        total = torch.cuda.get_device_properties(index).total_memory
        if self.cap_bytes >= total:
            log.warning("rank %d: memory_cap_bytes=%d is not below the device's %d bytes; the cap has no effect",
                        self.rank, self.cap_bytes, total)
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap_bytes / total), device=index)
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(self._on_cuda_oom)

    def _on_cuda_oom(self, device: int, alloc: int, _limit: int, _free: int) -> None:
        # Called by the caching allocator after it has released its lock; keep it to numbers.
        self._cuda_oom = (int(alloc), int(torch.cuda.memory_allocated(device)))

    def measuring(self):
        return self._tracker if self._tracker is not None else contextlib.nullcontext()

    def peaks(self) -> MemoryPeaks:
        """Both peaks so far (a failed rank's: up to its failure)."""
        if self._cuda_in_use():
            now = int(torch.cuda.max_memory_allocated())
            # Before the window the allocator's peak is the run's; after its reset, the window's
            # (and, once the window closed, the rest of the run's too).
            run = max(self._cuda_before_window, now) if self._window != "before" else now
            measured = {"before": -1, "open": now, "closed": self._cuda_window_peak}[self._window]
            return MemoryPeaks(run, measured, "cuda.max_memory_allocated")
        if self._tracker is not None:
            return MemoryPeaks(self._tracker.peak_bytes, self._tracker.window_peak_bytes, "cpu.tracked_storage_peak")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return MemoryPeaks(int(rss if sys.platform == "darwin" else rss * 1024), -1, "cpu.peak_rss")

    def oom_report(self, exc: BaseException) -> OomReport | None:
        """What to report when the script stopped with ``exc``; None unless it ran out of memory."""
        oom = find_oom(exc)
        if oom is None:
            return None
        requested, in_use = -1, -1
        if self._tracker is not None and self._tracker.last_oom is not None:
            requested, in_use = self._tracker.last_oom
        elif self._cuda_oom is not None:
            requested, in_use = self._cuda_oom
        return OomReport(rank=self.rank, step=self._current_step(), requested_bytes=requested,
                         cap_bytes=self.cap_bytes, in_use_bytes=in_use, device=self.device,
                         message=str(oom).strip()[:2000])
