"""The ``coordinator`` engine (``prism collect``): values come from the coordinator's CPU executor.

On a collective the worker hands its inputs to the coordinator, releases its slot and blocks until
the coordinator returns the outputs and a slot (DESIGN §6). A send is buffered by the coordinator
and completes at once. A recv is registered at once and fetched only when the script waits for
it (``Work.wait``), because pipeline schedules post a recv before the send that its peer needs
first. Collectives block inside ``submit`` since DDP waits on the future from C++, which no Python
``wait`` sees.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import torch

from prism.graph.records import CommOp
from prism.rpc import CommHeader, CoordinatorClient, FetchError, TensorMeta

from .base import CommEngine, CommRequest

__all__ = ["CoordinatorEngine"]

log = logging.getLogger(__name__)

_TORCH_DIR = os.path.dirname(torch.__file__)
_PRISM_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _call_site() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH_DIR, _PRISM_DIR)) and not name.startswith("<"):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _write(outputs: list[torch.Tensor], values: list[torch.Tensor], what: str) -> None:
    if not values:
        return
    if len(values) != len(outputs):
        raise FetchError(f"{what}: the coordinator returned {len(values)} tensors for {len(outputs)} outputs")
    with torch.no_grad():
        for out, value in zip(outputs, values, strict=True):
            out.copy_(value.view(out.shape) if value.shape != out.shape else value)


class _DeferredFuture(torch.futures.Future):
    """A future whose value is fetched when someone waits for it from Python."""

    def __init__(self, resolve) -> None:
        super().__init__()
        self._resolve = resolve

    def wait(self):
        if not self.done():
            self._resolve(self)
        return super().wait()


class CoordinatorEngine(CommEngine):
    name = "coordinator"

    def __init__(self, *, address: str, rank: int, token: str = "") -> None:
        self._client = CoordinatorClient(address, token=token)
        self._rank = rank
        self._lock = threading.RLock()
        self._next_op = 0
        self._client.register(rank, os.getpid())

    def _header(self, req: CommRequest, inputs: list[torch.Tensor], op_index: int) -> CommHeader:
        return CommHeader(
            rank=self._rank, op_index=op_index, op=req.op.value, group_id=req.group.group_id,
            group_ranks=tuple(req.group.ranks), seq=req.seq, reduce_op=req.reduce_op, root=req.root,
            peer=req.peer, tag=req.tag, in_splits=tuple(req.in_splits), out_splits=tuple(req.out_splits),
            flat=req.flat, coalesced=req.coalesced, inputs=tuple(TensorMeta.of(t) for t in inputs),
            outputs=tuple(TensorMeta.of(t) for t in req.outputs), call_site=_call_site(),
        )

    def _inputs_to_send(self, req: CommRequest) -> list[torch.Tensor]:
        if req.op in (CommOp.RECV, CommOp.BARRIER):
            return []
        if req.op is CommOp.BROADCAST and req.root != self._rank:
            return []  # only the root's values matter
        return list(req.inputs)

    def submit(self, req: CommRequest) -> torch.futures.Future:
        what = f"rank {self._rank} {req.op.value} {req.group.group_id}:{req.seq}"
        with self._lock:
            op_index = self._next_op
            self._next_op += 1
            inputs = self._inputs_to_send(req)
            self._client.submit(self._header(req, inputs, op_index), inputs)
        if req.op is CommOp.SEND:
            future: torch.futures.Future = torch.futures.Future()
            future.set_result(req.outputs)
            return future
        if req.op is CommOp.RECV:
            def resolve(fut: torch.futures.Future) -> None:
                try:
                    with self._lock:
                        _write(req.outputs, self._client.fetch(self._rank, op_index), what)
                except Exception as e:  # noqa: BLE001 - delivered to every waiter
                    fut.set_exception(e)
                    return
                fut.set_result(req.outputs)

            return _DeferredFuture(resolve)
        with self._lock:
            values = self._client.fetch(self._rank, op_index)
        _write(req.outputs, values, what)
        future = torch.futures.Future()
        future.set_result(req.outputs)
        return future

    def shutdown(self) -> None:
        try:
            self._client.finish(self._rank)
        finally:
            self._client.close()
