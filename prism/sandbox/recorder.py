"""The recorder: turns what one rank did into PrismTrace nodes.

Every comm op becomes a node with a stable identity (group + sequence; src/dst + per-pair
sequence), its shapes, dtype, bytes, reduce op, async flag and call site. Compute spans are the
intervals between comm boundaries on the rank's own clock: ``perf_counter_ns`` on CPU; on CUDA a
timing event recorded on the current stream at each boundary (:mod:`.cuda_clock`), read when the
rank finishes, so the recorder never synchronizes the device (a comm's end is the event its engine
recorded after the op on the op's stream, when it gives one). Iteration boundaries come from
``torch.optim.Optimizer.step`` (a global post hook) or ``prism.mark_step()``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from prism.graph.records import CommOp, GroupInfo, Node, NodeKind, RankRecord, RankSummary

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


def _call_site_and_async(default_async: bool) -> tuple[str, bool]:
    """The first frame outside torch and prism, and c10d's ``async_op`` if a c10d frame is on the stack."""
    frame = sys._getframe(3)
    site = ""
    is_async = default_async
    seen_c10d = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if not seen_c10d and filename.endswith(_C10D_FILE) and "async_op" in frame.f_locals:
            is_async = bool(frame.f_locals["async_op"])
            seen_c10d = True
        if not filename.startswith((_TORCH_DIR, _PRISM_DIR)) and not filename.startswith("<"):
            site = f"{os.path.basename(filename)}:{frame.f_lineno}"
            break
        frame = frame.f_back
    return site, is_async


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
        self._step_times: list[int] = []
        self._losses: list[float] = []
        self._pending_loss: list[torch.Tensor] = []
        self._reported_loss: float | None = None
        self._end_ns: dict[int, int | GpuStamp] = {}
        self._explicit_marks = False

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

    def on_complete(self, token: int, end_event: torch.cuda.Event | None = None) -> None:
        """The op's outputs are final; on CUDA ``end_event`` (recorded on the op's stream after it)
        says when on the device."""
        with self._lock:
            if end_event is not None and self._gpu is not None:
                self._end_ns[token] = self._gpu.adopt(end_event)
            else:  # completed on the host (a host-staged or CPU op): the CPU clock says when
                self._end_ns[token] = time.perf_counter_ns()

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
                self._pending_loss.append(t.detach())

    def report(self, loss=None) -> None:
        if loss is not None:
            self._reported_loss = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)

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
            elif self._pending_loss and self._gpu is not None and self._pending_loss[0].is_cuda:
                # Read a step late: ``.item()`` here would synchronize the device every step.
                self._losses.append([t.to("cpu", non_blocking=True) for t in self._pending_loss])
            elif self._pending_loss:
                self._losses.append(float(sum(t.float().item() for t in self._pending_loss)))
            else:
                self._losses.append(float("nan"))
            self._pending_loss.clear()
            self._reported_loss = None
            self._step += 1
            self._last_boundary = now if self._gpu is not None else time.perf_counter_ns()

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
        """Loss per finished step so far (on CUDA: waits for the device)."""
        with self._lock:
            self._resolve()
            return tuple(self._losses)

    @property
    def step_times_ns(self) -> tuple[int, ...]:
        """Duration of each finished step (on CUDA: on the device's timeline; waits for it)."""
        with self._lock:
            self._resolve()
            return tuple(CudaEventClock.ns(b) - CudaEventClock.ns(a) for a, b in self._step_times)

    # -- result -------------------------------------------------------------------------------
    def finish(self, *, peak_memory_bytes: int, memory_source: str, engine: str, exit_code: int = 0) -> RankRecord:
        with self._lock:
            self._boundary()
            self._resolve()
            kept: list[dict] = []
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
            nodes = []
            for i, fields in enumerate(kept):
                if "target" in fields:  # a WAIT names its op by position
                    fields["target"] = new_index[fields["target"]]
                nodes.append(Node(rank=self.rank, index=i, **fields))
            summary = RankSummary(
                rank=self.rank,
                losses=tuple(self._losses),
                step_times_ns=tuple(CudaEventClock.ns(b) - CudaEventClock.ns(a) for a, b in self._step_times),
                peak_memory_bytes=peak_memory_bytes,
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
