"""Timestamps on the GPU timeline without synchronizing (the recorder on CUDA).

A comm boundary records a timing event on the current stream; nothing waits for it. The events
are read when the rank finishes (or when too many are pending): one synchronization per anchor,
never one per boundary. An event's time is ``anchor_cpu_ns + anchor.elapsed_time(event)``, where
the anchor is an event recorded on an idle device right after a synchronize, so its GPU time is
the CPU time read just after it completed (within a few µs). Events of different streams of one
device share that timeline, so comm end events recorded on side streams are comparable.

On a GPU job the CPU runs ahead of the device; a CPU clock at comm boundaries would measure the
launch queue, not the work. Synchronizing at every boundary (what the recorder did before) cost
+16 % on a 13 ms DDP step (notes/gpu-facts.md §3).
"""

from __future__ import annotations

import time

import torch

__all__ = ["GpuStamp", "CudaEventClock"]


class GpuStamp:
    """One pending timestamp (an event recorded on some stream)."""

    __slots__ = ("event", "ns")

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event: torch.cuda.Event | None = event
        self.ns: int | None = None


class CudaEventClock:
    _RESOLVE_EVERY = 4096
    """Pending stamps past this count are resolved (their events are long complete by then)."""

    def __init__(self, device: torch.device | int | None = None) -> None:
        self._device = device
        self._anchor: torch.cuda.Event | None = None
        self._anchor_ns = 0
        self._pending: list[GpuStamp] = []

    def _ensure_anchor(self) -> None:
        if self._anchor is None:
            torch.cuda.synchronize(self._device)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self._anchor_ns = time.perf_counter_ns()
            self._anchor = ev

    def stamp(self, stream: torch.cuda.Stream | None = None) -> GpuStamp:
        """Record an event now on ``stream`` (default: the current stream)."""
        self._ensure_anchor()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        s = GpuStamp(ev)
        self._pending.append(s)
        if len(self._pending) > self._RESOLVE_EVERY:
            self._resolve(self._pending[: self._RESOLVE_EVERY // 2])
            del self._pending[: self._RESOLVE_EVERY // 2]
        return s

    def adopt(self, event: torch.cuda.Event) -> GpuStamp:
        """A stamp for an event someone else recorded (a comm's end on its stream)."""
        self._ensure_anchor()
        s = GpuStamp(event)
        self._pending.append(s)
        return s

    def _resolve(self, stamps: list[GpuStamp]) -> None:
        assert self._anchor is not None
        for s in stamps:
            if s.event is not None:
                s.event.synchronize()
                s.ns = self._anchor_ns + round(self._anchor.elapsed_time(s.event) * 1e6)
                s.event = None

    def resolve_all(self) -> None:
        """Read every pending event (waits for the device once)."""
        if self._anchor is None:
            return
        self._resolve(self._pending)
        self._pending.clear()

    @staticmethod
    def ns(stamp: GpuStamp | int) -> int:
        """A resolved stamp's time on the ``perf_counter_ns`` clock (ints pass through)."""
        if isinstance(stamp, GpuStamp):
            assert stamp.ns is not None, "resolve_all() first"
            return stamp.ns
        return stamp
