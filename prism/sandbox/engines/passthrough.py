"""The ``passthrough`` engine: forward every op to a real gloo/NCCL group and only observe.

Used by ``prism record``: all W ranks run as real processes, and each logical group of the script
gets a real backend group built directly from the store c10d hands the ``"prism"`` creator
(ProcessGroupGloo for CPU tensors; ProcessGroupNCCL for CUDA tensors unless the job asks for gloo,
which is how several ranks share one GPU). Values and timing are the real backend's.

Gloo lacks a few reduce ops; ``avg`` is executed as ``sum`` followed by a division by the group
size (what NCCL does too), so the values match a real NCCL run up to rounding.

Gloo's send/recv works have no future; a helper thread per *stream* (the collectives of a group,
the sends to one peer, the receives from one peer) waits for them in order and completes ours. One
helper for all of them would let a receive that has arrived wait behind an earlier send to a slow
peer (a gloo send completes only when the receiver has posted its receive): a pipeline stage's
next activation would then wait for the stage after it, which no real gloo run does.

On the timed pass (no aliases) the script's own wait completes a gloo send/recv or collective on
its own thread, as a plain gloo run's wait returns there; the helper, or the backend's own future,
takes it only when something else asks first (docs/timing.md, "Messages the script waits for").
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import functools
import logging
import os

import torch
import torch.distributed as dist

from prism.graph.records import CommOp

from ..memtrack import untracked
from .base import CommEngine, CommRequest, GroupHandle, complete_op
from .completion import CompletionThreads, WaiterClaims, wait_for_work

__all__ = ["PassthroughEngine"]

log = logging.getLogger(__name__)

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,  # divided afterwards
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


_OPTS_CACHE: dict[tuple, object] = {}


def _reduce_opts(cls, reduce_op: str, **kw):
    """The options object, made once per distinct value (the backend only reads it; building one
    costs more than the rest of a small op's bookkeeping)."""
    key = (cls, reduce_op, *kw.items())
    opts = _OPTS_CACHE.get(key)
    if opts is not None:
        return opts
    if reduce_op not in _REDUCE_OPS:
        raise ValueError(f"prism passthrough: reduce op {reduce_op!r} is not supported by the real backend")
    opts = cls()
    opts.reduceOp = _REDUCE_OPS[reduce_op]
    for k, v in kw.items():
        setattr(opts, k, v)
    _OPTS_CACHE[key] = opts
    return opts


def _host_copy(req: CommRequest) -> CommRequest | None:
    """The request on host copies of its CUDA tensors (aliasing kept), or None if all are on the
    host. gloo cannot send or reduce-scatter device memory, and this is how several ranks share
    one GPU in a real run (NCCL refuses two ranks on one device)."""
    if not any(t.is_cuda for t in (*req.inputs, *req.outputs)):
        return None
    copies: dict[int, torch.Tensor] = {}

    def host(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in copies:
            copies[id(t)] = t.detach().cpu() if t.is_cuda else t
        return copies[id(t)]

    return dataclasses.replace(req, inputs=[host(t) for t in req.inputs], outputs=[host(t) for t in req.outputs])


def _unowned(req: CommRequest) -> CommRequest:
    """The request on aliases of its CPU tensors that do not own their memory (aliasing kept).

    ProcessGroupGloo's worker thread holds a collective's tensors until it drops the work, which
    it does only after completing the future that wakes the script (``ProcessGroupGloo::runLoop``):
    a tensor the script frees right after the op then lives on for however long that thread takes,
    and counts in the rank's tracked peak or not depending on scheduling (#12: 2-4 KiB on hybrid's
    measured steps; ``bench/gloo_hold.py``). Given aliases, gloo's references keep no storage of the
    script's alive; the engine holds the real tensors until the op completes, and drops them
    before the script wakes, as the ``live`` engine does."""
    aliases: dict[int, torch.Tensor] = {}

    def alias(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in aliases:
            st = t.untyped_storage()
            if t.is_cpu and st.nbytes():
                raw = torch.frombuffer((ctypes.c_char * st.nbytes()).from_address(st.data_ptr()), dtype=torch.uint8)
                aliases[id(t)] = raw.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())
            else:
                aliases[id(t)] = t
        return aliases[id(t)]

    return dataclasses.replace(req, inputs=[alias(t) for t in req.inputs], outputs=[alias(t) for t in req.outputs])


def _divide(outputs: list[torch.Tensor], size: int) -> None:
    """``avg`` executed as ``sum``: divide by the group size (0: not an average)."""
    if size:
        with torch.no_grad():
            for t in outputs:
                if t.is_floating_point() or t.is_complex():
                    t.div_(size)
                else:
                    t.floor_divide_(size)


def _wait_and_divide(work, outputs: list[torch.Tensor], divide: int) -> None:
    work.wait()
    _divide(outputs, divide)


def _kind(work, req: CommRequest) -> tuple:
    """What decides whether a gloo work has a future of its own."""
    return type(work), req.op, req.flat, req.coalesced


def _wait_collective(future: torch.futures.Future, work, _op_kind, outputs, extra: dict, divide: int):
    """:class:`WaitedFuture`'s ``run`` for a gloo collective on the script's own tensors."""
    return wait_for_work(future, work, outputs, extra, functools.partial(_divide, outputs, divide) if divide else None)


class PassthroughEngine(CommEngine):
    name = "passthrough"
    divides_avg = True
    """Whether ``avg`` is executed as ``sum`` then a division (the real backend lacks ``avg``)."""

    def __init__(self, *, cuda_backend: str = "nccl", timeout_s: float = 300.0, eager_completion: bool = False) -> None:
        assert cuda_backend in ("nccl", "gloo")
        self._cuda_backend = cuda_backend
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._gloo: dict[str, dist.ProcessGroupGloo] = {}
        self._nccl: dict[str, object] = {}
        self._stores: dict[str, object] = {}
        self._completion = CompletionThreads("prism-passthrough-wait")
        self._futureless: set[tuple] = set()
        """Kinds of (work type, op, flat, coalesced) whose gloo work has no future."""
        self._claims = WaiterClaims(eager=eager_completion)
        """Per stream (a peer's sends, a peer's receives), the send/recv that waits for its waiter."""
        # Only where the tracked CPU peak is measured (record's memory pass): elsewhere the aliases
        # would only cost time (prism.sandbox.memory reads the same variable).
        self._unowned = os.environ.get("PRISM_MEMORY", "tracked") == "tracked"

    def create_group(self, group: GroupHandle, store) -> None:
        self._stores[group.group_id] = store
        self._gloo[group.group_id] = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo/", store), group.group_rank, group.size, self._timeout
        )
        if self._cuda_backend == "nccl" and torch.cuda.is_available():
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self._timeout
            self._nccl[group.group_id] = dist.ProcessGroupNCCL(
                dist.PrefixStore("nccl/", store), group.group_rank, group.size, opts
            )

    def _backend_for(self, req: CommRequest):
        tensors = req.inputs or req.outputs
        if tensors and tensors[0].is_cuda and req.group.group_id in self._nccl:
            return self._nccl[req.group.group_id]
        return self._gloo[req.group.group_id]

    def submit(self, req: CommRequest) -> torch.futures.Future:
        pg = self._backend_for(req)
        gloo = isinstance(pg, dist.ProcessGroupGloo)
        staged = _host_copy(req) if gloo else None
        with untracked():
            # Host copies (staged) are the engine's own: only the script's CPU tensors are aliased.
            unowned = self._unowned and staged is None and gloo
            works = self._start(pg, staged or (_unowned(req) if unowned else req))
        if gloo and staged is None and not unowned:
            # The script's own wait completes the op on its own thread, as a plain gloo run's wait
            # returns there (issue 11 part 5: a pipeline makes dozens of messages per step, a
            # tensor-parallel layer a collective waited at once), unless something else asks first.
            if req.op in (CommOp.SEND, CommOp.RECV):
                (work,) = works  # no future of its own, nothing to finish: completed with the outputs
                return self._waited(work, req)
            if len(works) == 1:
                return self._waited_collective(works[0], req)  # DDP's reducer takes the future first
        futures = [self._future_of(w, req) for w in works]
        done = torch.futures.collect_all(futures) if len(futures) != 1 else futures[0]
        if not isinstance(pg, dist.ProcessGroupGloo) and works:
            self._observe_nccl(req, works, futures)
        # ``finish`` runs on the thread that completes the backend's work, and torch destroys a
        # callback only after the future it completes has woken the script: it holds no request
        # and empties ``held`` as it runs, or a tensor only the op still references (a pipeline
        # stage's sent gradient) would outlive the script's wake-up by however long that thread
        # takes, and count in the rank's peak or not depending on scheduling.
        held = [req.outputs, staged.outputs if staged is not None else req.outputs, req.inputs if unowned else ()]
        divide = self._divisor(req)
        del staged

        def finish(f):
            outputs, results, _inputs = held
            held.clear()
            f.value()  # re-raises a backend error into our future
            _divide(results, divide)
            if results is not outputs:
                with torch.no_grad():
                    for out, host in zip(outputs, results, strict=True):
                        out.copy_(host)
            return outputs

        return done.then(finish)

    def _observe_nccl(self, req: CommRequest, works: list, futures: list) -> None:
        """``Work.wait()`` of the script goes to the real works, so ProcessGroupNCCL releases its
        stash of the op's tensors exactly as it would unobserved. The recorder takes no end event
        for an async NCCL op: waiting for its future on another stream would record the op's
        tensors on that stream (``recordDataPtrOnStream``), which changes which blocks the caching
        allocator hands out next and so the rank's ``max_memory_allocated``; the op's end shows
        where the script waits for it (its WAIT node, or the stream order of a synchronous op)."""

        def wait() -> None:
            for w in works:
                w.wait()

        req.extra["wait"] = wait

    def _backend_future(self, work, kind: tuple) -> torch.futures.Future | None:
        """The work's own future, or None for a gloo work that has none (send/recv,
        ``_allgather_base``). Asking costs a C++ exception where there is none (8 µs): asked once
        per kind of op."""
        if kind not in self._futureless:
            try:
                return work.get_future()
            except RuntimeError:
                self._futureless.add(kind)
        return None

    def _future_of(self, work, req: CommRequest) -> torch.futures.Future:
        future = self._backend_future(work, _kind(work, req))
        return future if future is not None else self._helper_future(work, req, None)

    def _waited(self, work, req: CommRequest) -> torch.futures.Future:
        """A gloo send/recv's future, completed by the thread that waits for it (``WaitedFuture``)."""
        return self._claims.future((req.group.group_id, req.op.value, req.peer), (work, req.outputs, req.extra),
                                   wait_for_work, self._to_helper)

    def _divisor(self, req: CommRequest) -> int:
        """What an ``avg`` op's outputs are divided by after the backend's ``sum`` (0: nothing)."""
        if self.divides_avg and req.reduce_op == "avg" and req.op in (
                CommOp.ALL_REDUCE, CommOp.REDUCE_SCATTER, CommOp.REDUCE):
            return req.group.size
        return 0

    def _waited_collective(self, work, req: CommRequest) -> torch.futures.Future:
        """A gloo collective's future, completed by the thread that waits for it (``WaitedFuture``);
        handed to the backend's own future (its thread runs the rest) if something else asks first."""
        op = (work, _kind(work, req), req.outputs, req.extra, self._divisor(req))
        return self._claims.future((req.group.group_id,), op, _wait_collective, self._collective_to_backend)

    def _collective_to_backend(self, future: torch.futures.Future, work, kind: tuple, outputs, extra: dict,
                               divide: int) -> None:
        backend_future = self._backend_future(work, kind)
        if backend_future is None:
            # a gloo work without a future (e.g. _allgather_base): the group's helper waits for it
            self._completion.complete(future.stream, functools.partial(_wait_and_divide, work, outputs, divide),
                                      future, outputs, extra)
            return
        del work
        held = [outputs, extra, future]
        del outputs, extra, future

        def finish(f):
            outputs, extra, future = held
            held.clear()
            try:
                f.value()
                _divide(outputs, divide)
            except BaseException as e:  # noqa: BLE001 - delivered to the script's wait
                future.set_exception(e)
                return
            complete_op(future, outputs, extra)

        backend_future.then(finish)

    def _to_helper(self, future: torch.futures.Future, work, value, extra: dict) -> None:
        self._completion.complete(future.stream, work.wait, future, value, extra)

    def _helper_future(self, work, req: CommRequest, value) -> torch.futures.Future:
        """A future for a gloo work that has none (send/recv, e.g. _allgather_base), completed with
        ``value`` by the stream's completion thread when the work is done, in issue order."""
        future: torch.futures.Future = torch.futures.Future()
        stream = (req.group.group_id, req.op.value, req.peer) if req.op in (CommOp.SEND, CommOp.RECV) \
            else (req.group.group_id,)
        self._completion.complete(stream, work.wait, future, value, req.extra)
        return future

    def _start(self, pg, req: CommRequest) -> list:
        op, g = req.op, req.group
        me = g.group_rank
        if op is CommOp.ALL_REDUCE:
            return [pg.allreduce([t], _reduce_opts(dist.AllreduceOptions, req.reduce_op)) for t in req.inputs]
        if op is CommOp.ALL_GATHER:
            if req.flat:
                return [pg._allgather_base(o, i) for o, i in zip(req.outputs, req.inputs, strict=True)]
            if req.coalesced:
                n = g.size
                return [
                    pg.allgather([req.outputs[k * n : (k + 1) * n]], [inp]) for k, inp in enumerate(req.inputs)
                ]
            return [pg.allgather([req.outputs], req.inputs)]
        if op is CommOp.REDUCE_SCATTER:
            opts = lambda: _reduce_opts(dist.ReduceScatterOptions, req.reduce_op)  # noqa: E731
            if req.flat:
                return [pg._reduce_scatter_base(o, i, opts()) for o, i in zip(req.outputs, req.inputs, strict=True)]
            return [pg.reduce_scatter(req.outputs, [req.inputs], opts())]
        if op is CommOp.ALL_TO_ALL:
            if req.flat:
                return [
                    pg.alltoall_base(
                        req.outputs[0], req.inputs[0], list(req.out_splits), list(req.in_splits), dist.AllToAllOptions()
                    )
                ]
            return [pg.alltoall(req.outputs, req.inputs, dist.AllToAllOptions())]
        if op is CommOp.BROADCAST:
            opts = dist.BroadcastOptions()
            opts.rootRank = g.to_group_rank(req.root)
            opts.rootTensor = 0
            return [pg.broadcast([t], opts) for t in req.inputs]
        if op is CommOp.REDUCE:
            opts = _reduce_opts(dist.ReduceOptions, req.reduce_op, rootRank=g.to_group_rank(req.root), rootTensor=0)
            return [pg.reduce(req.inputs, opts)]
        if op is CommOp.GATHER:
            opts = dist.GatherOptions()
            opts.rootRank = g.to_group_rank(req.root)
            outs = [req.outputs] if req.root == g.global_rank else []
            return [pg.gather(outs, req.inputs, opts)]
        if op is CommOp.SCATTER:
            opts = dist.ScatterOptions()
            opts.rootRank = g.to_group_rank(req.root)
            ins = [req.inputs] if req.root == g.global_rank else []
            return [pg.scatter(req.outputs, ins, opts)]
        if op is CommOp.BARRIER:
            return [pg.barrier(dist.BarrierOptions())]
        if op is CommOp.SEND:
            return [pg.send(req.inputs, g.to_group_rank(req.peer), req.tag)]
        if op is CommOp.RECV:
            return [pg.recv(req.outputs, g.to_group_rank(req.peer), req.tag)]
        raise AssertionError(f"unhandled op {op} (rank {me})")

    def shutdown(self) -> None:
        self._claims.hand_over_all()
        self._completion.close()
        for pg in list(self._nccl.values()):
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                log.debug("nccl shutdown failed", exc_info=True)
        self._gloo.clear()
        self._nccl.clear()
