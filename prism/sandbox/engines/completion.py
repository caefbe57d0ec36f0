"""Futures completed in issue order by one thread per stream, for backend work that has no future
of its own (gloo send/recv, a gloo lane's delegated op): the thread blocks in the work's wait and
then completes the op's future, so completion is driven by the backend, not by ``Work.wait()``.

Every reference the thread holds to the op (the work, the callable that waits for it) is dropped
before the future completes: a tensor the script has let go (a sent gradient) must not outlive the
script's wake-up here, or it counts in the rank's peak whenever this thread loses the CPU in
between (docs/emulate.md, "What a rank's peak counts").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable

import torch

from .base import stamp_done

__all__ = ["CompletionThreads"]


class CompletionThreads:
    """One daemon thread per stream key, started on the stream's first op."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queues: dict[Hashable, queue.SimpleQueue] = {}
        self._lock = threading.Lock()

    def complete(self, stream: Hashable, wait: Callable[[], None], future: torch.futures.Future, value,
                 extra: dict) -> None:
        """Run ``wait()`` on the stream's thread after the stream's earlier ops, then complete
        ``future`` with ``value`` (the moment stamped in the op's ``extra`` first, which is dropped
        before the future completes like the rest of the op), or with the exception ``wait`` raised."""
        self._queue(stream).put([wait, extra, value, future])

    def _queue(self, stream: Hashable) -> queue.SimpleQueue:
        q = self._queues.get(stream)
        if q is None:
            with self._lock:
                q = self._queues.get(stream)
                if q is None:
                    q = self._queues[stream] = queue.SimpleQueue()
                    label = "-".join(map(str, stream)) if isinstance(stream, tuple) else str(stream)
                    threading.Thread(target=_loop, args=(q,), daemon=True, name=f"{self._name}-{label}").start()
        return q

    def close(self) -> None:
        """Let every stream's thread end once its queued ops are done."""
        with self._lock:
            for q in self._queues.values():
                q.put(None)


def _loop(q: queue.SimpleQueue) -> None:
    while (item := q.get()) is not None:
        future, value, extra = item.pop(), item.pop(), item.pop()
        try:
            _wait(item)
        except BaseException as e:  # noqa: BLE001 - delivered to the script's wait
            future.set_exception(e)
        else:
            stamp_done(extra)
            extra = None
            future.set_result(value)
        item = future = value = extra = None


def _wait(item: list) -> None:
    """Pops the op's ``wait`` from ``item`` and calls it; neither ``item`` nor a traceback through
    this frame holds it afterwards."""
    wait = item.pop()
    try:
        wait()
    finally:
        del wait
