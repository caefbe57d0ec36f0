"""The sandbox side of the GPU data path (``nccl`` layout): delegated ops over NCCL lanes, with
ProcessGroupNCCL's stream and tensor-lifetime semantics.

An op of a group that has vranks goes over the rank's lane to the group's replayer
(:func:`prism.nccl_patches.vplan.device_lanes`): on the caller's thread, in program order — as
ProcessGroupNCCL enqueues — the rank sends its inputs (the script's own device tensors) and
receives its outputs straight into the script's output tensors. The lane's NCCL streams wait for
the current stream at enqueue, so the transfers start when the data is ready; the returned future
is a CUDA future completed at enqueue whose waiters' streams wait for the transfers, so the CPU
never blocks. Only the list forms (all-gather/reduce-scatter/all-to-all into a list, gather,
scatter, barrier) take a flat temporary, as ProcessGroupNCCL's ``newLikeFlat`` does.

Tensor lifetimes follow ProcessGroupNCCL (torch ≥ 2.8, notes/gpu-facts.md §1): a collective's
inputs and outputs are *stashed* until ``Work.wait()``, or until a watchdog (polling every
100 ms) has seen the op complete *and* the next op is enqueued on the same group; a message's
tensors live as long as its work. That is what makes an NCCL run's allocator peak differ from a
gloo run's, and the emulation reproduces it.

Lanes are opened when the script creates the group (as NCCL connects at init) and warmed up with
one message each way, so no connection is made inside a measured step.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from prism.core.errors import PrismError
from prism.graph.records import CommOp
from prism.nccl_patches.ipc_lane import IpcLane, same_gpu
from prism.nccl_patches.linkmodel import probe_echo
from prism.nccl_patches.vplan import Lane, op_parts, receives_output, sends_input

from ..memtrack import untracked
from .base import CommRequest
from .completion import CompletionThreads

__all__ = ["DeviceLanes", "WATCHDOG_PERIOD_S"]

log = logging.getLogger(__name__)

WATCHDOG_PERIOD_S = 0.1
"""ProcessGroupNCCL's watchdog sleep (``kWatchdogThreadSleepMillis``)."""

_REPLAYER_END = 1


@dataclass(eq=False)
class _Shelf:
    """The tensors ProcessGroupNCCL would stash for one async collective."""

    tensors: list = field(default_factory=list)
    end: torch.cuda.Event | None = None
    complete: bool = False


class _OpenLane:
    def __init__(self, lane: Lane, pg: dist.ProcessGroup | IpcLane, device: torch.device) -> None:
        self.lane = lane
        self.pg = pg
        self.kind = "ipc" if isinstance(pg, IpcLane) else "nccl" if device.type == "cuda" else "gloo"
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.lock = threading.Lock()
        self.stashed: list[_Shelf] = []
        self.to_release: list[_Shelf] = []


class DeviceLanes:
    """Every lane of one sandbox rank, and the watchdog that unstashes completed collectives."""

    def __init__(self, *, rank: int, device: torch.device, lanes: list[tuple[Lane, int]],
                 store_factory: Callable[[], dist.Store], timeout_s: float) -> None:
        """``device`` cuda: NCCL lanes; cpu: gloo lanes (the ``lanes`` path: the same protocol on
        CPU, for tests and CPU jobs)."""
        self.rank = rank
        self.device = device
        self._cuda = device.type == "cuda"
        self._planned = {(ln.group_id, ln.src, ln.dst): ln for ln, _ in lanes}
        self._store_factory = store_factory
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._open: dict[tuple[str, int, int], _OpenLane] = {}
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._completion = CompletionThreads(f"prism-lane-wait-{rank}")
        """gloo lanes: one thread per lane completes its ops, in order."""
        self.num_ops = 0
        self.traffic_bytes = 0

    # ------------------------------------------------------------------------------ lanes

    @property
    def num_lanes(self) -> int:
        return len(self._planned)

    def lane_kinds(self) -> dict[str, int]:
        """How many open lanes of each transport (nccl, ipc, gloo)."""
        kinds: dict[str, int] = {}
        for lane in self._open.values():
            kinds[lane.kind] = kinds.get(lane.kind, 0) + 1
        return kinds

    def has_vranks(self, group_id: str) -> bool:
        return any(k[0] == group_id for k in self._planned)

    def open_group(self, group_id: str) -> None:
        """Connect and warm up the group's lanes (called when the script creates the group)."""
        for key, lane in self._planned.items():
            if key[0] == group_id and key not in self._open:
                self._open[key] = self._connect(lane)
        if self._open and self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"prism-lanes-watchdog-{self.rank}", daemon=True)
            self._watchdog.start()

    def _connect(self, lane: Lane) -> _OpenLane:
        store = dist.PrefixStore(lane.prefix + "/", self._store_factory())
        if not self._cuda:
            pg = dist.ProcessGroupGloo(store, 0, 2, self._timeout)
            probe = torch.zeros(1)
            with untracked():
                pg.send([probe], _REPLAYER_END, 0).wait()
                pg.recv([probe], _REPLAYER_END, 0).wait()
                probe_echo(pg, _REPLAYER_END, self.device)  # the replayer times the link
            return _OpenLane(lane, pg, self.device)
        with torch.cuda.device(self.device):
            if same_gpu(store, 0, self.device):  # the replayer shares this GPU: NCCL would refuse
                pg = IpcLane(store, 0, self.device)
            else:
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = self._timeout
                pg = dist.ProcessGroupNCCL(store, 0, 2, opts)
            probe = torch.zeros(1, device=self.device)
            pg.send([probe], _REPLAYER_END, 0).wait()
            pg.recv([probe], _REPLAYER_END, 0).wait()
            torch.cuda.synchronize(self.device)
        opened = _OpenLane(lane, pg, self.device)
        log.debug("rank %d: lane %s up (%s)", self.rank, lane.prefix, opened.kind)
        return opened

    def lane_for(self, req: CommRequest) -> _OpenLane | None:
        if req.op in (CommOp.SEND, CommOp.RECV):
            me = req.group.global_rank
            src, dst = (me, req.peer) if req.op is CommOp.SEND else (req.peer, me)
            return self._open.get((req.group.group_id, src, dst))
        return self._open.get((req.group.group_id, -1, -1))

    # ------------------------------------------------------------------------------ one op

    def submit(self, req: CommRequest, lane: _OpenLane) -> torch.futures.Future:
        """Enqueue ``req`` on ``lane`` now; the returned CUDA future is already complete."""
        self._release_completed(lane)
        g = req.group
        me, n = g.group_rank, g.size
        root = g.to_group_rank(req.root) if req.root >= 0 else 0
        p2p = req.op in (CommOp.SEND, CommOp.RECV)
        # CUDA: the flat temporaries count, as ProcessGroupNCCL's own do; CPU: gloo's buffers are
        # the backend's, not the script's (docs/emulate.md, "What a rank's peak counts").
        with contextlib.nullcontext() if self._cuda else untracked():
            sends = self._inputs(req, me, n, root) if (p2p and req.op is CommOp.SEND) or \
                (not p2p and sends_input(req.op, me, root)) else []
            bufs, temps = self._outputs(req, n) if receives_output(req.op, me, root) else ([], False)
        if not self._cuda:
            return self._submit_host(req, lane, sends, bufs, temps, me, root)
        future = torch.futures.Future(devices=[self.device])
        works = []
        with torch.cuda.device(self.device):
            for t in sends:
                works.append(lane.pg.send([t], _REPLAYER_END, 0))
            for b in bufs:
                works.append(lane.pg.recv([b], _REPLAYER_END, 0))
            with torch.cuda.stream(lane.side):
                for w in works:
                    w.wait()  # the side stream waits for the transfers; the CPU does not
                if temps:
                    with torch.no_grad():
                        _write_outputs(req, bufs, me, root)
                end = torch.cuda.Event(enable_timing=True)
                end.record(lane.side)
                future.set_result(req.outputs)
        self.num_ops += 1
        self.traffic_bytes += sum(t.numel() * t.element_size() for t in (*sends, *bufs))
        req.extra["end_event"] = end
        if p2p:
            # ProcessGroupNCCL's P2P: no stash; the work keeps its tensors (and the lane's works
            # keep them until they are dropped with it).
            def wait_p2p() -> None:
                future.wait()
                del works[:]

            req.extra["wait"] = wait_p2p
            return future
        shelf = _Shelf([*req.inputs, *req.outputs, *bufs, works], end)
        with lane.lock:
            lane.stashed.append(shelf)

        def wait_collective() -> None:
            future.wait()  # the current stream waits for the end event
            with lane.lock:
                if shelf in lane.stashed:
                    lane.stashed.remove(shelf)
                if shelf in lane.to_release:
                    lane.to_release.remove(shelf)
            shelf.tensors.clear()

        req.extra["wait"] = wait_collective
        return future

    def _submit_host(self, req: CommRequest, lane: _OpenLane, sends, bufs, temps: bool, me: int,
                     root: int) -> torch.futures.Future:
        """gloo lanes (CPU): the transfers are posted on the caller's thread, in program order, and
        the lane's completion thread completes the future when they are done, as gloo's own thread
        completes an async op's work: the script computes on meanwhile (DDP's bucket all-reduces
        overlap the backward). Nothing is stashed (ProcessGroupGloo keeps no tensors past
        completion)."""
        with untracked():
            works = [lane.pg.send([t], _REPLAYER_END, 0) for t in sends]
            works += [lane.pg.recv([b], _REPLAYER_END, 0) for b in bufs]
        self.num_ops += 1
        self.traffic_bytes += sum(t.numel() * t.element_size() for t in (*sends, *bufs))
        future: torch.futures.Future = torch.futures.Future()
        what = f"rank {self.rank}: {req.op.value} on group {req.group.group_id} seq {req.seq}"
        self._completion.complete(lane.lane.prefix, lambda: self._end_op(works, bufs if temps else None, req, me, root, what),
                                  future, req.outputs, req.extra)
        return future

    def _end_op(self, works: list, temps: list | None, req: CommRequest, me: int, root: int, what: str) -> None:
        """On the lane's completion thread: wait for the op's transfers, then write the flat
        temporaries (if any) into the script's outputs."""
        timeout = self._timeout
        for w in works:
            try:
                done = w.wait(timeout)
            except RuntimeError as e:  # gloo raises on a timeout and on a message of another size
                late = "Timed out" in str(e)
                raise PrismError(f"{what}: " + (f"the replayer did not answer within {timeout}" if late else
                                                f"the lane to the replayer failed: {e}")) from e
            if not done:
                raise PrismError(f"{what}: the replayer did not answer within {timeout}")
        if temps is not None:
            with torch.no_grad():
                _write_outputs(req, temps, me, root)

    def _inputs(self, req: CommRequest, me: int, n: int, root: int) -> list[torch.Tensor]:
        if req.op is CommOp.SEND:
            return [t.detach().contiguous().reshape(-1) for t in req.inputs]
        parts = op_parts(req.op, req.inputs, n=n, group_rank=me, root=root, flat=req.flat,
                         in_splits=req.in_splits, out_splits=req.out_splits, outputs=req.outputs,
                         what=f"rank {self.rank}: {req.op.value} on group {req.group.group_id} seq {req.seq}")
        return [p.data.contiguous() for p in parts]

    def _outputs(self, req: CommRequest, n: int) -> tuple[list[torch.Tensor], bool]:
        """Where each part's flat output lands: the script's tensors when the op has one flat,
        contiguous output per part; else flat temporaries (copied out when they arrive)."""
        op, outs = req.op, req.outputs
        direct = op in (CommOp.ALL_REDUCE, CommOp.BROADCAST, CommOp.REDUCE, CommOp.RECV) or (
            req.flat and op in (CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, CommOp.ALL_TO_ALL))
        if direct and all(t.is_contiguous() for t in outs):
            return [t.detach().view(-1) for t in outs], False
        dev = self.device
        if op is CommOp.BARRIER:
            return [torch.empty(1, dtype=torch.int32, device=dev)], True
        if op in (CommOp.ALL_GATHER, CommOp.GATHER):
            return [torch.empty(n * t.numel(), dtype=t.dtype, device=dev) for t in req.inputs], True
        if op is CommOp.SCATTER:
            return [torch.empty(n * outs[0].numel(), dtype=outs[0].dtype, device=dev)], True
        if op is CommOp.ALL_TO_ALL or op is CommOp.REDUCE_SCATTER:
            return [torch.empty(sum(t.numel() for t in outs), dtype=outs[0].dtype, device=dev)], True
        return [torch.empty(t.numel(), dtype=t.dtype, device=dev) for t in outs], True

    # ------------------------------------------------------------------- stash release

    @staticmethod
    def _release_completed(lane: _OpenLane) -> None:
        # ProcessGroupNCCL empties the watchdog's list at the start of the next enqueue on the group.
        if lane.to_release:
            with lane.lock:
                done, lane.to_release = lane.to_release, []
            for shelf in done:
                shelf.tensors.clear()

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_PERIOD_S):
            for lane in list(self._open.values()):
                with lane.lock:
                    done = [s for s in lane.stashed if s.end is not None and s.end.query()]
                    for s in done:
                        lane.stashed.remove(s)
                    lane.to_release.extend(done)

    def close(self) -> None:
        if self._open and self._cuda:
            torch.cuda.synchronize(self.device)  # every transfer of the run has landed
        self._stop.set()
        self._completion.close()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)
        for lane in self._open.values():
            lane.stashed.clear()
            lane.to_release.clear()
            try:
                lane.pg.shutdown()
            except Exception:  # noqa: BLE001 - the run is over; a peer may be gone already
                log.debug("lane shutdown failed", exc_info=True)
        self._open.clear()


def _write_outputs(req: CommRequest, outs: list[torch.Tensor], me: int, root: int) -> None:
    from .live import _write_outputs as write  # noqa: PLC0415 - one definition of the layout

    write(req, outs, me, root)

