"""The ``"prism"`` process group: a Python ``dist.ProcessGroup`` for logical ranks.

Every group the script creates (init_process_group, new_group, split_group, DeviceMesh
subgroups) becomes a :class:`PrismProcessGroup`. It is only bookkeeping: each call is turned into a
:class:`~prism.sandbox.engines.base.CommRequest`, numbered (collective sequence per group,
message sequence per (src, dst, group)), shown to the recorder, and handed to the active comm
engine, which decides the outputs and when the returned work completes.

Method names differ between torch versions (notes/torch-facts.md): 2.13 calls
``all_gather_single``/``reduce_scatter_single``/``all_to_all_single``, 2.11 calls
``_allgather_base``/``_reduce_scatter_base``/``alltoall_base``; both spellings are implemented.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from prism.graph.records import CommOp

from .engines.base import DONE_NS, CommEngine, CommRequest, GroupHandle

__all__ = ["BACKEND_NAME", "PrismProcessGroup", "PrismWork", "SandboxContext", "register_backend", "reduce_op_name"]

log = logging.getLogger(__name__)

BACKEND_NAME = "prism"


class CommObserver(Protocol):
    def on_issue(self, request: CommRequest) -> int: ...
    def on_complete(self, token: int, end_event: object = None, done_ns: int | None = None) -> None: ...
    def on_wait(self, token: int) -> Callable[[], None]: ...
    def on_group(self, group: GroupHandle) -> None: ...


class SandboxContext:
    """The per-process state the process groups share: engine, observer, counters."""

    def __init__(self, engine: CommEngine, observer: CommObserver, *, world_size: int, rank: int) -> None:
        self.engine = engine
        self.observer = observer
        self.world_size = world_size
        self.rank = rank
        self._lock = threading.Lock()
        self.watch = None
        """An ``opwatch.OpPublisher`` when the launcher watches for hangs, else None."""
        self._coll_seq: dict[str, int] = {}
        self._p2p_seq: dict[tuple[int, int, str], int] = {}

    def next_collective_seq(self, group_id: str) -> int:
        with self._lock:
            seq = self._coll_seq.get(group_id, 0)
            self._coll_seq[group_id] = seq + 1
            return seq

    def next_p2p_seq(self, src: int, dst: int, group_id: str) -> int:
        with self._lock:
            key = (src, dst, group_id)
            seq = self._p2p_seq.get(key, 0)
            self._p2p_seq[key] = seq + 1
            return seq


_context: SandboxContext | None = None


def set_context(context: SandboxContext | None) -> None:
    global _context
    _context = context


def get_context() -> SandboxContext:
    if _context is None:
        raise RuntimeError("the prism sandbox is not installed in this process (run the script with prism)")
    return _context


def reduce_op_name(op: object) -> str:
    """``dist.ReduceOp`` (or its RedOpType) -> ``sum``, ``avg``, ``premul_sum`` ..."""
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    return name.lower()


def _value_or_raise(future: torch.futures.Future):
    """A child's callback for a C++ consumer (DDP's reducer) of an engine's Python future. Python's
    ``set_exception`` stores the exception as the future's value, which C++ reads as the op's
    tensors (the reducer's ``extractTensors()[0]`` of an exception object: the rank segfaults, its
    log empty). Raising here fails the child as a C++ error: the script's ``backward`` raises it."""
    return future.value()


def _succeeded(future: torch.futures.Future) -> bool:
    if not future.done():
        return False
    try:
        future.value()
    except Exception:  # noqa: BLE001 - a failed op
        return False
    return True


class PrismWork(dist.Work):
    """Work whose completion the engine decides; ``wait`` is observed for the graph."""

    def __init__(self, future: torch.futures.Future, on_wait: Callable[[], Callable[[], None]],
                 waiter: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._future = future
        self._on_wait = on_wait
        self._waiter = waiter
        """The engine's own wait (e.g. a CUDA op's: the current stream waits, the stash is released)."""

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - c10d passes a timedelta
        done = self._on_wait()
        if self._waiter is not None:
            self._waiter()
        else:
            self._future.wait()
        done()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done()

    def exception(self):
        return None

    def get_future(self) -> torch.futures.Future:
        future = self._future
        if not _succeeded(future):  # an engine's Python future, which may fail
            return future.then(_value_or_raise)
        return future

    def result(self):
        return self._future.value()

    def synchronize(self) -> None:
        self._future.wait()


class PrismProcessGroup(dist.ProcessGroup):
    """A logical process group of the sandbox (see module docstring)."""

    def __init__(self, handle: GroupHandle, context: SandboxContext) -> None:
        super().__init__(handle.group_rank, handle.size)
        self.handle = handle
        self._context = context
        self._group_name = handle.group_id
        self._group_desc = handle.desc

    # -- identity (functional collectives resolve groups by name) --------------------------
    # c10d asks the default group for its rank about three times per new_group call (DeviceMesh
    # makes W/n of them); the inherited binding costs ~4 µs per call on a Python subclass, a plain
    # Python method ~0.1 µs. C++ callers still read the same values from the base class.
    def rank(self) -> int:
        return self.handle.group_rank

    def size(self) -> int:
        return self.handle.size

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        return self._group_name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc
        self._context.observer.on_group(dataclasses.replace(self.handle, desc=desc))

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return f"PrismProcessGroup({self.handle.group_id}, rank {self.handle.group_rank} of {self.handle.ranks})"

    # -- plumbing ------------------------------------------------------------------------------
    def _issue(self, request: CommRequest) -> PrismWork:
        ctx = self._context
        if request.op in (CommOp.SEND, CommOp.RECV):
            src, dst = (
                (self.handle.global_rank, request.peer)
                if request.op is CommOp.SEND
                else (request.peer, self.handle.global_rank)
            )
            request.seq = ctx.next_p2p_seq(src, dst, self.handle.group_id)
        else:
            request.seq = ctx.next_collective_seq(self.handle.group_id)
        token = ctx.observer.on_issue(request)
        watch = ctx.watch
        if watch is not None:
            watch.issued(token, self.handle)
        try:
            future = ctx.engine.submit(request)
        except Exception as e:
            future = torch.futures.Future()
            future.set_exception(e)
        extra = request.extra
        if watch is None:
            future.add_done_callback(lambda _f: ctx.observer.on_complete(token, extra.get("end_event"),
                                                                         extra.get(DONE_NS)))
        else:
            future.add_done_callback(
                lambda _f: (ctx.observer.on_complete(token, extra.get("end_event"), extra.get(DONE_NS)),
                            watch.completed(token)))
        return PrismWork(future, lambda: ctx.observer.on_wait(token), extra.get("wait"))

    def _req(self, op: CommOp, inputs, outputs, **kw) -> PrismWork:
        return self._issue(CommRequest(op=op, group=self.handle, inputs=list(inputs), outputs=list(outputs), **kw))

    def _root(self, group_root: int) -> int:
        return self.handle.ranks[group_root]

    # -- collectives -----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._req(CommOp.ALL_REDUCE, tensors, tensors, reduce_op=op, coalesced=len(tensors) > 1)

    def allreduce_coalesced(self, tensors, opts=None):
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._req(CommOp.ALL_REDUCE, tensors, tensors, reduce_op=op, coalesced=True)

    def allgather(self, output_tensors, input_tensors, opts=None):
        # output_tensors: [[t_rank0, t_rank1, ...]] (one list per input tensor)
        assert len(input_tensors) == 1, "one input tensor per allgather"
        return self._req(CommOp.ALL_GATHER, input_tensors, output_tensors[0])

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        outs = [t for lst in output_lists for t in lst]
        return self._req(CommOp.ALL_GATHER, input_tensors, outs, coalesced=True)

    def all_gather_single(self, output, input, opts=None):
        return self._req(CommOp.ALL_GATHER, [input], [output], flat=True)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._req(CommOp.ALL_GATHER, inputs, outputs, flat=True, coalesced=True)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        assert len(output_tensors) == 1, "one output tensor per reduce_scatter"
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._req(CommOp.REDUCE_SCATTER, input_lists[0], output_tensors, reduce_op=op)

    def reduce_scatter_single(self, output, input, opts=None):
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._req(CommOp.REDUCE_SCATTER, [input], [output], reduce_op=op, flat=True)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._req(CommOp.REDUCE_SCATTER, inputs, outputs, reduce_op=op, flat=True, coalesced=True)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._req(
            CommOp.ALL_TO_ALL,
            [input],
            [output],
            in_splits=tuple(int(s) for s in input_split_sizes),
            out_splits=tuple(int(s) for s in output_split_sizes),
            flat=True,
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._req(CommOp.ALL_TO_ALL, input_tensors, output_tensors)

    def broadcast(self, tensors, opts=None):
        root = self._root(opts.rootRank if opts is not None else 0)
        return self._req(CommOp.BROADCAST, tensors, tensors, root=root, coalesced=len(tensors) > 1)

    def reduce(self, tensors, opts=None):
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        root = self._root(opts.rootRank if opts is not None else 0)
        return self._req(CommOp.REDUCE, tensors, tensors, reduce_op=op, root=root)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts.rootRank)
        outs = output_tensors[0] if output_tensors else []
        return self._req(CommOp.GATHER, input_tensors, outs, root=root)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts.rootRank)
        ins = input_tensors[0] if input_tensors else []
        return self._req(CommOp.SCATTER, ins, output_tensors, root=root)

    def barrier(self, opts=None):
        return self._req(CommOp.BARRIER, [], [])

    # -- point to point ------------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        return self._req(CommOp.SEND, tensors, [], peer=self.handle.ranks[dst], tag=tag)

    def recv(self, tensors, src, tag=0):
        return self._req(CommOp.RECV, [], tensors, peer=self.handle.ranks[src], tag=tag)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError(
            "prism: recv from any source is not supported (the sender would be decided by timing); "
            "pass src= to recv"
        )


def _create_prism_pg(common_opts, backend_opts) -> PrismProcessGroup:
    ctx = get_context()
    ranks = tuple(common_opts.global_ranks_in_group) or tuple(range(common_opts.group_size))
    assert len(ranks) == common_opts.group_size, (ranks, common_opts.group_size)
    handle = GroupHandle(group_id=str(common_opts.group_id), ranks=ranks, group_rank=common_opts.group_rank)
    ctx.observer.on_group(handle)
    ctx.engine.create_group(handle, common_opts.store)
    return PrismProcessGroup(handle, ctx)


_registered = False


def register_backend() -> None:
    """Register ``"prism"`` with c10d (idempotent)."""
    global _registered
    if _registered or BACKEND_NAME in dist.Backend.backend_list:
        _registered = True
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_prism_pg, extended_api=True, devices=["cpu", "cuda"])
    _registered = True
