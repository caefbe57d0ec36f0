"""Futures completed in issue order by one thread per stream, for backend work that has no future
of its own (gloo send/recv, a gloo lane's delegated op): the thread blocks in the work's wait and
then completes the op's future, so completion is driven by the backend, not by ``Work.wait()``.

A message the script waits for is completed by the waiting thread instead (:class:`WaitedFuture`,
docs/timing.md, "Messages the script waits for"): the stream's thread gets it only when something
else asks for its completion, when the stream's next op comes first, or at the end.

Every reference the thread holds to the op (the work, the callable that waits for it) is dropped
before the future completes: a tensor the script has let go (a sent gradient) must not outlive the
script's wake-up here, or it counts in the rank's peak whenever this thread loses the CPU in
between (docs/emulate.md, "What a rank's peak counts").
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Hashable

import torch

from .base import complete_op, stamp_done

__all__ = ["CompletionThreads", "WaitedFuture", "WaiterClaims", "wait_for_work"]


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


class WaitedFuture(torch.futures.Future):
    """The future of a message (a send or a receive) that the first thread to wait for it completes,
    on that thread, as a plain gloo run's ``Work.wait`` does; once anything else asks (``done``,
    ``value``, ``then``: a poll, a C++ consumer) or :class:`WaiterClaims` moves on, the op is
    handed over to a helper thread of its engine instead.

    A helper that waits for every message costs two more thread hand-offs per message (the backend
    wakes the helper, which takes the GIL to complete the future, which wakes the script): on a
    host with few cores that was most of a message's cost. A gloo message has exactly one waiter (a
    second wait would consume another message's completion), so the op goes to whoever claims it.

    ``run(future, *op)`` waits for the op on the calling thread and returns what completes the
    future (after the op's references are dropped); ``hand_over(future, *op)`` gives the op to a
    helper thread that does the same."""

    def __init__(self, claims: WaiterClaims, stream: Hashable, op: tuple,
                 run: Callable[..., Callable[[], None]], hand_over: Callable[..., None]) -> None:
        super().__init__()
        self._claims = claims
        self.stream = stream
        self.op: tuple | None = op
        """What ``run`` needs, until a waiter or the helper claims it."""
        self._run = run
        self._hand_over = hand_over

    def wait(self):
        op = self._claims.claim(self)
        if op is not None:
            complete = self._run(self, *op)
            del op  # the op's tensors are dropped before the future wakes anyone
            complete()
            del complete
        return super().wait()

    def hand_over(self) -> None:
        """Let a helper thread complete the op (unless a waiter has it already)."""
        if self.op is None:  # claimed for good: a poll takes no lock
            return
        op = self._claims.claim(self)
        if op is not None:
            self._hand_over(self, *op)

    def done(self) -> bool:
        self.hand_over()
        return super().done()

    def value(self):
        self.hand_over()
        return super().value()

    def then(self, callback):
        self.hand_over()
        return super().then(callback)


class WaiterClaims:
    """Per stream, the one op whose completion waits for its waiter; the stream's earlier ops go
    to the helper when a later one is issued, so no op waits for a wait that comes late or never.

    ``eager``: every op goes to its helper at once, so its completion is stamped when the backend
    finished it, not when the script waited for it (a pipeline posts its receives early and waits
    for them after its compute: the waiter's stamp would hold that compute). Calibration slices
    ask for it, at the cost of two thread hand-offs per op (docs/timing.md)."""

    def __init__(self, *, eager: bool = False) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, WaitedFuture] = {}
        self.eager = eager

    def future(self, stream: Hashable, op: tuple, run: Callable[..., Callable[[], None]],
               hand_over: Callable[..., None]) -> WaitedFuture:
        future = WaitedFuture(self, stream, op, run, hand_over)
        if self.eager:
            future.hand_over()
            return future
        with self._lock:
            earlier = self._waiting.pop(stream, None)
            self._waiting[stream] = future
        if earlier is not None:
            earlier.hand_over()
        return future

    def claim(self, future: WaitedFuture) -> tuple | None:
        """The future's op, to the first caller (then None)."""
        with self._lock:
            op, future.op = future.op, None
            if op is not None and self._waiting.get(future.stream) is future:
                del self._waiting[future.stream]
        return op

    def hand_over_all(self) -> None:
        """The end of the program: every op still waiting for its waiter goes to its helper."""
        with self._lock:
            waiting = list(self._waiting.values())
        for future in waiting:
            future.hand_over()


def wait_for_work(future: torch.futures.Future, work, value, extra: dict,
                  then: Callable[[], None] | None = None) -> Callable[[], None]:
    """:class:`WaitedFuture`'s ``run`` for a backend work: wait for it here (then call ``then``,
    e.g. an ``avg``'s division); complete ``future`` with ``value`` (stamped first) or with the
    error either raised."""
    try:
        work.wait()
        if then is not None:
            then()
    except BaseException as e:  # noqa: BLE001 - delivered to every waiter of the future
        return functools.partial(future.set_exception, e)
    del work
    return functools.partial(complete_op, future, value, extra)
