"""The recorder: turns what one rank did into PrismTrace nodes.

Every comm op becomes a node with a stable identity (group + sequence; src/dst + per-pair
sequence), its shapes, dtype, bytes, reduce op, async flag and call site. Compute spans are the
intervals between comm boundaries on the rank's own clock: ``perf_counter_ns`` on CPU; on CUDA a
timing event recorded on the current stream at each boundary (:mod:`.cuda_clock`), read when the
rank finishes, so the recorder never synchronizes the device (a comm's end is the event its engine
recorded after the op on the op's stream, when it gives one). Iteration boundaries come from
``torch.optim.Optimizer.step`` (a global post hook), the job's ``iterations.boundary`` or
``prism.mark_step()``; a rank that ends without any gets them from the period of its comm sequence
(:func:`prism.graph.steps.infer_step_marks`), so every role that records the same op sequence sees
the same steps.
"""

from __future__ import annotations

import bisect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from prism.graph.records import CommOp, GroupInfo, Node, NodeKind, RankRecord, RankSummary

from prism.graph.steps import StepInference, infer_step_marks, step_times_from_marks

from .cuda_clock import CudaEventClock, GpuStamp
from .engines.base import CommRequest, GroupHandle

__all__ = ["Recorder", "dtype_short", "RankRecord"]

log = logging.getLogger(__name__)

_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
}


def dtype_short(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).replace("torch.", ""))


_TORCH_DIR = os.path.dirname(torch.__file__)
_PRISM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_C10D_FILE = "distributed_c10d.py"


_C10D, _C10D_ASYNC, _INSIDE, _OUTSIDE = 0, 1, 2, 3
_code_kind: dict[int, tuple[object, int]] = {}
"""id(code) -> (code, where its file lies: c10d (with an ``async_op`` argument or not), torch or
prism, or the user's code). A pipeline schedule issues each message dozens of frames below the
script, so the walk classifies each frame's code once. Keyed by id: a code object's hash is
computed anew on every lookup (Python 3.11 hashes its constants and names each time); the entry
keeps the code alive, so its id is not reused."""
_sites: dict[tuple[int, int], str] = {}
"""(id(code), instruction offset) of the user's frame -> ``file:line`` (the code is kept alive by
``_code_kind``). ``f_lineno`` scans the code's line table on every read."""


def _kind_of(code) -> int:
    entry = _code_kind.get(id(code))
    if entry is not None:
        return entry[1]
    filename = code.co_filename
    if not filename.startswith((_TORCH_DIR, _PRISM_DIR, "<")):
        kind = _OUTSIDE
    elif filename.endswith(_C10D_FILE):
        kind = _C10D_ASYNC if "async_op" in code.co_varnames else _C10D
    else:
        kind = _INSIDE
    _code_kind[id(code)] = (code, kind)
    return kind


def _call_site_and_async(default_async: bool) -> tuple[str, bool]:
    """The first frame outside torch and prism, and c10d's ``async_op`` if a c10d frame is on the stack."""
    frame = sys._getframe(3)
    is_async = default_async
    seen_c10d = False
    while frame is not None:
        kind = _kind_of(frame.f_code)
        if kind == _OUTSIDE:
            key = (id(frame.f_code), frame.f_lasti)
            site = _sites.get(key)
            if site is None:
                site = _sites[key] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
            return site, is_async
        # f_locals builds a dict of every local (Python 3.11): only where the function has the argument
        if kind == _C10D_ASYNC and not seen_c10d and "async_op" in frame.f_locals:
            is_async = bool(frame.f_locals["async_op"])
            seen_c10d = True
        frame = frame.f_back
    return "", is_async


class Recorder:
    """Records one rank. Thread-safe: completion callbacks arrive on backend threads."""

    def __init__(self, rank: int, world_size: int, *, sync_cuda: bool = False, clock_origin_ns: int = 0) -> None:
        self.rank = rank
        self.world_size = world_size
        self._cuda = sync_cuda
        self._gpu: CudaEventClock | None = None
        """GPU timestamps, from the first boundary after the script initialized CUDA."""
        self._lock = threading.Lock()
        self._nodes: list[dict] = []
        self._groups: dict[str, GroupInfo] = {}
        self._other_groups: dict[str, GroupInfo] = {}
        now = time.perf_counter_ns()
        # Times are offsets from the origin. A launcher on one host hands every rank the same
        # origin on the shared monotonic clock, so times of different ranks are comparable.
        self.clock_origin_ns = clock_origin_ns or now
        self._t0 = self.clock_origin_ns
        self._last_boundary = now
        self._step = 0
        self._step_start = now
        self._begin_ns = now - self._t0
        """When this rank started, on the recorded clock: where step 0 begins."""
        self._step_times: list[tuple[int | GpuStamp, int | GpuStamp]] = []
        """(start, end) of each marked step."""
        self._losses: list[float] = []
        self._pending_loss: list[tuple[int, torch.Tensor]] = []
        """(node position, scalar root of backward) since the last mark."""
        self._reported_loss: float | None = None
        self._reported_log: list[tuple[int, float]] = []
        """(node position, loss) of prism.report calls, for steps inferred at the end."""
        self._inferred: tuple[int, StepInference] | None = None
        self._end_ns: dict[int, int | GpuStamp] = {}
        self._explicit_marks = False
        self._step_listeners: list[Callable[[int], None]] = []

    # -- clock --------------------------------------------------------------------------------
    # A time is an int (perf_counter_ns) or, on CUDA, a GpuStamp resolved when the rank finishes;
    # nodes keep them raw and ``finish`` turns them into offsets from the origin.
    def _now(self) -> int | GpuStamp:
        if self._gpu is not None:
            return self._gpu.stamp()
        if self._cuda and torch.cuda.is_initialized():
            self._gpu = CudaEventClock()
            return self._gpu.stamp()
        return time.perf_counter_ns()

    def _boundary(self) -> int | GpuStamp:
        """Close the current compute span; returns the boundary time."""
        now = self._now()
        self._nodes.append({"kind": NodeKind.COMPUTE, "_start": self._last_boundary, "_end": now, "step": self._step})
        self._last_boundary = now
        return now

    def _ns(self, t: int | GpuStamp) -> int:
        return CudaEventClock.ns(t) - self._t0

    # -- comm observer (called by the process group) ---------------------------------------
    def on_group(self, group: GroupHandle) -> None:
        with self._lock:
            self._groups[group.group_id] = GroupInfo(group.group_id, group.ranks, group.desc)

    def on_other_group(self, group: GroupInfo) -> None:
        """A group created while this rank is not a member (kept for DP templates' renaming)."""
        with self._lock:
            self._other_groups[group.group_id] = group

    def on_issue(self, req: CommRequest) -> int:
        site, is_async = _call_site_and_async(default_async=True)
        tensors = req.inputs if req.op is not CommOp.RECV else req.outputs
        node: dict = {
            "op": req.op,
            "group_id": req.group.group_id,
            "seq": req.seq,
            "tag": req.tag,
            "size_bytes": sum(t.numel() * t.element_size() for t in tensors),
            "dtype": dtype_short((tensors or req.outputs or req.inputs)[0].dtype) if (tensors or req.outputs or req.inputs) else "",
            "shapes": tuple(tuple(t.shape) for t in tensors),
            "reduce_op": req.reduce_op,
            "is_async": is_async,
            "call_site": site,
            "in_splits": req.in_splits,
            "out_splits": req.out_splits,
        }
        if req.op in (CommOp.SEND, CommOp.RECV):
            node["kind"] = NodeKind.SEND if req.op is CommOp.SEND else NodeKind.RECV
            node["peer"] = req.peer
        else:
            node["kind"] = NodeKind.COLLECTIVE
            node["peer"] = req.root
            if req.op in (CommOp.ALL_GATHER, CommOp.ALL_TO_ALL, CommOp.REDUCE_SCATTER, CommOp.GATHER, CommOp.SCATTER):
                out_shapes = tuple(tuple(t.shape) for t in req.outputs)
                if out_shapes != node["shapes"]:
                    node["out_shapes"] = out_shapes
        with self._lock:
            node["start_ns"] = self._boundary()
            node["step"] = self._step
            self._nodes.append(node)
            token = len(self._nodes) - 1
        return token

    def comm_node(self, token: int) -> dict:
        """The fields recorded for the comm op ``token`` (read by the hang watcher's publisher)."""
        return self._nodes[token]

    def on_complete(self, token: int, end_event: torch.cuda.Event | None = None, done_ns: int | None = None) -> None:
        """The op's outputs are final; on CUDA ``end_event`` (recorded on the op's stream after it)
        says when on the device; else ``done_ns``, when the engine completed the op (this call may
        come later: it waits for the GIL while the woken script runs Python), or now."""
        with self._lock:
            if end_event is not None and self._gpu is not None:
                self._end_ns[token] = self._gpu.adopt(end_event)
            else:  # completed on the host (a host-staged or CPU op): the CPU clock says when
                self._end_ns[token] = done_ns if done_ns is not None else time.perf_counter_ns()

    def on_wait(self, token: int) -> Callable[[], None]:
        with self._lock:
            start = self._boundary()
            self._nodes.append({"kind": NodeKind.WAIT, "target": token, "start_ns": start, "step": self._step})
            wait_index = len(self._nodes) - 1

        def done() -> None:
            with self._lock:
                end = self._now()
                self._nodes[wait_index]["_end"] = end
                self._last_boundary = end

        return done

    # -- iterations and reports ----------------------------------------------------------------
    def on_backward_root(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point():
                self._pending_loss.append((len(self._nodes), t.detach()))

    def report(self, loss=None) -> None:
        if loss is not None:
            self._reported_loss = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
            self._reported_log.append((len(self._nodes), self._reported_loss))

    def add_step_listener(self, listener: Callable[[int], None]) -> None:
        """``listener(steps_done)`` is called on the script's thread after each step ends (the
        memory meter's measured window)."""
        self._step_listeners.append(listener)

    def mark_step(self, *, from_optimizer: bool = False) -> None:
        """End the current step. Once the script marks steps itself (``prism.mark_step``), optimizer
        steps no longer do."""
        if from_optimizer and self._explicit_marks:
            return
        if not from_optimizer:
            self._explicit_marks = True
        with self._lock:
            now = self._boundary()
            self._nodes.append({"kind": NodeKind.MARK, "mark": "step_end", "start_ns": now, "step": self._step})
            self._step_times.append((self._step_start, now))
            self._step_start = now
            if self._reported_loss is not None:
                self._losses.append(self._reported_loss)
            elif self._pending_loss and self._gpu is not None and self._pending_loss[0][1].is_cuda:
                # Read a step late: ``.item()`` here would synchronize the device every step.
                self._losses.append([t.to("cpu", non_blocking=True) for _, t in self._pending_loss])
            elif self._pending_loss:
                self._losses.append(float(sum(t.float().item() for _, t in self._pending_loss)))
            else:
                self._losses.append(float("nan"))
            self._pending_loss.clear()
            self._reported_loss = None
            self._reported_log.clear()
            self._step += 1
            self._last_boundary = now if self._gpu is not None else time.perf_counter_ns()
            steps_done = self._step
        for listener in self._step_listeners:
            listener(steps_done)

    def _resolve(self) -> None:
        """Read the pending GPU timestamps and losses (one device synchronization)."""
        if self._gpu is None:
            return
        self._gpu.resolve_all()
        torch.cuda.synchronize()
        self._losses = [float(sum(t.float().item() for t in x)) if isinstance(x, list) else x for x in self._losses]

    @property
    def current_step(self) -> int:
        """The step under way (0-based): how many steps have ended so far."""
        return self._step

    @property
    def losses(self) -> tuple[float, ...]:
        """Loss per finished step so far (on CUDA: waits for the device; inferred steps: once the
        script has ended)."""
        with self._lock:
            self._resolve()
            return self._steps()[2] if self._step == 0 else tuple(self._losses)

    @property
    def step_times_ns(self) -> tuple[int, ...]:
        """Duration of each finished step (on CUDA: on the device's timeline, waits for it;
        inferred steps: once the script has ended)."""
        with self._lock:
            self._resolve()
            return self._steps()[1] if self._step == 0 else self._marked_step_times()

    def _marked_step_times(self) -> tuple[int, ...]:
        return tuple(CudaEventClock.ns(b) - CudaEventClock.ns(a) for a, b in self._step_times)

    def _node_list(self) -> tuple[list[Node], list[int]]:
        """The nodes with times as offsets from the origin (stamps resolved, empty compute spans
        dropped, WAIT targets renumbered), and the kept nodes' positions in ``self._nodes``."""
        kept: list[dict] = []
        old: list[int] = []
        new_index: dict[int, int] = {}
        for i, n in enumerate(self._nodes):
            fields = dict(n)
            kind = fields["kind"]
            if kind is NodeKind.COMPUTE:
                start, end = self._ns(fields.pop("_start")), self._ns(fields.pop("_end"))
                if end <= start:
                    continue
                fields.update(start_ns=start, duration_ns=end - start)
            else:
                fields["start_ns"] = self._ns(fields["start_ns"])
                if "_end" in fields:
                    fields["duration_ns"] = max(0, self._ns(fields.pop("_end")) - fields["start_ns"])
                if i in self._end_ns and kind in (NodeKind.COLLECTIVE, NodeKind.SEND, NodeKind.RECV):
                    fields["duration_ns"] = max(0, self._ns(self._end_ns[i]) - fields["start_ns"])
            new_index[i] = len(kept)
            kept.append(fields)
            old.append(i)
        nodes = []
        for i, fields in enumerate(kept):
            if "target" in fields:  # a WAIT names its op by position
                fields["target"] = new_index[fields["target"]]
            nodes.append(Node(rank=self.rank, index=i, **fields))
        return nodes, old

    def _steps(self) -> tuple[list[Node], tuple[int, ...], tuple[float, ...]]:
        """Nodes, step times and losses: as marked, or inferred from the period of the comm sequence
        when nothing marked a step (caller holds the lock; stamps resolved)."""
        nodes, old = self._node_list()
        if self._step > 0:
            return nodes, self._marked_step_times(), tuple(self._losses)
        if self._inferred is None or self._inferred[0] != len(nodes):
            self._inferred = (len(nodes), infer_step_marks(nodes) if nodes else StepInference((), None, 0))
        inf = self._inferred[1]
        if inf.period is None:
            return nodes, (), ()

        def step_of(pos: int) -> int:  # a position in self._nodes, before empty spans were dropped
            return inf.step_of(bisect.bisect_left(old, pos))

        reported: dict[int, float] = {}
        for pos, value in self._reported_log:
            reported[step_of(pos)] = value
        summed: dict[int, float] = {}
        for pos, t in self._pending_loss:
            k = step_of(pos)
            summed[k] = summed.get(k, 0.0) + t.float().item()
        losses = tuple(reported.get(k, summed.get(k, float("nan"))) for k in range(inf.num_steps))
        times = step_times_from_marks(inf.nodes, self._begin_ns)
        return list(inf.nodes), times, losses

    # -- result -------------------------------------------------------------------------------
    def finish(self, *, peak_memory_bytes: int, memory_source: str, engine: str, exit_code: int = 0,
               measured_peak_memory_bytes: int = -1) -> RankRecord:
        with self._lock:
            self._boundary()
            self._resolve()
            nodes, step_times, losses = self._steps()
            summary = RankSummary(
                rank=self.rank,
                losses=losses,
                step_times_ns=step_times,
                peak_memory_bytes=peak_memory_bytes,
                measured_peak_memory_bytes=measured_peak_memory_bytes,
                memory_source=memory_source,
                exit_code=exit_code,
            )
            return RankRecord(
                rank=self.rank,
                world_size=self.world_size,
                nodes=nodes,
                groups=list(self._groups.values()),
                summary=summary,
                engine=engine,
                clock_origin_ns=self.clock_origin_ns,
                other_groups=list(self._other_groups.values()),
            )
