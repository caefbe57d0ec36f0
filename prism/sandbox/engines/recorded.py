"""The ``recorded`` engine: one rank replays its recorded job alone (``prism replay``, RankLens §III-D).

Every comm op of the script is aligned to a record of the same rank in a recorded graph by
(training position, group, signature, order): the k-th op with this signature on this group in
this step. The engine then

* restores values (``values``): the op's recorded outputs are copied into the script's own output
  tensors when it completes (value-enhanced replay); without ``values`` the ``fake`` engine's
  filler is used (structure-and-timing replay);
* completes the op's future at ``submit + duration``: the recorded duration (issue to completion
  on this rank), or one estimated from the other records (:mod:`prism.graph.estimate`) for an op
  with no record, a withheld record, or every op under ``timing=estimated``.

Submission returns at once and a timer thread completes the futures, so the script's compute
after an async op overlaps it and its ``wait()`` blocks until the recorded completion, as with a
real backend. Ops of one stream (a group's collectives; the sends to, or receives from, one peer)
complete in submission order, as a real backend completes them.

To break inside the restoration under a debugger: :meth:`RecordedEngine._restore` copies the
recorded tensors into the outputs (docs/replay.md).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from prism.core.errors import PrismError
from prism.graph.estimate import CommFeatures, DurationEstimator, features_of, samples_from_graph
from prism.graph.io import read_graph
from prism.graph.payloads import load_index, load_payload, op_key
from prism.graph.records import CommOp, Graph, Node, NodeKind

from ..memtrack import untracked
from ..recorder import dtype_short
from .base import CommEngine, CommRequest, complete_op
from .fake import _fill

__all__ = ["ReplayOptions", "ReplayIndex", "RecordedEngine", "ReplayValueError", "record_payload_dir",
           "request_signature", "TIMINGS"]

log = logging.getLogger(__name__)

_MAX_SLACK_NS = 5_000_000
"""Wake-ups later than this are not counted in the timer's slack (the op was overdue when pushed)."""

TIMINGS = ("recorded", "estimated", "none")
"""none: every op completes at once (structure or value replay without timing, RankLens Table I)."""

_OUT_SHAPE_OPS = (CommOp.ALL_GATHER, CommOp.ALL_TO_ALL, CommOp.REDUCE_SCATTER, CommOp.GATHER, CommOp.SCATTER)


class ReplayValueError(PrismError, ValueError):
    """A recorded value cannot be restored into the script's op (missing, or another shape)."""


def record_payload_dir(run_dir: str | Path, rank: int) -> Path:
    """Where ``prism record --payloads`` keeps rank ``rank``'s received tensors."""
    return Path(run_dir) / "payloads_real" / f"rank-{rank}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOptions:
    run_dir: str
    rank: int
    graph: str = "real"
    """Which graph of the run holds the records: ``real`` (prism record) or ``timed`` (calibrate)."""
    values: bool = False
    timing: str = "recorded"
    withhold: float = 0.0
    """Fraction of this rank's records whose durations are withheld (and estimated): a check of
    the estimator against known durations."""
    seed: int = 0
    ranks_per_node: int = 0

    def to_engine_options(self) -> dict[str, str]:
        return {"run_dir": self.run_dir, "graph": self.graph, "values": "1" if self.values else "0",
                "timing": self.timing, "withhold": repr(self.withhold), "seed": str(self.seed)}

    @staticmethod
    def from_engine_options(opts: dict[str, str], *, rank: int, ranks_per_node: int) -> ReplayOptions:
        return ReplayOptions(run_dir=opts["run_dir"], rank=rank, graph=opts.get("graph", "real"),
                             values=opts.get("values") == "1", timing=opts.get("timing", "recorded"),
                             withhold=float(opts.get("withhold", "0")), seed=int(opts.get("seed", "0")),
                             ranks_per_node=ranks_per_node)


def request_signature(req: CommRequest) -> tuple:
    """The :meth:`Node.signature` the recorder gives this request."""
    tensors = req.inputs if req.op is not CommOp.RECV else req.outputs
    any_t = tensors or req.outputs or req.inputs
    shapes = tuple(tuple(t.shape) for t in tensors)
    if req.op in (CommOp.SEND, CommOp.RECV):
        kind, peer, out_shapes = (NodeKind.SEND if req.op is CommOp.SEND else NodeKind.RECV), req.peer, ()
    else:
        kind, peer, out_shapes = NodeKind.COLLECTIVE, req.root, ()
        if req.op in _OUT_SHAPE_OPS:
            outs = tuple(tuple(t.shape) for t in req.outputs)
            out_shapes = outs if outs != shapes else ()
    return (kind.value, req.op.value, req.group.ranks, peer, shapes, out_shapes,
            dtype_short(any_t[0].dtype) if any_t else "", req.reduce_op, req.in_splits, req.out_splits)


def _stream(op: CommOp, group_id: str, peer: int) -> tuple:
    return (group_id, op.value, peer) if op in (CommOp.SEND, CommOp.RECV) else (group_id,)


class ReplayIndex:
    """This rank's records, keyed for alignment, with durations and the estimator."""

    def __init__(self, graph: Graph, options: ReplayOptions) -> None:
        rank = options.rank
        if rank not in graph.nodes:
            raise ValueError(f"rank {rank} is not in the recorded graph ({graph.world_size} ranks)")
        self.graph = graph
        self.rank = rank
        self.ranks_per_node = options.ranks_per_node or graph.world_size
        comm = [n for n in graph.nodes[rank] if n.is_comm]
        rng = random.Random(options.seed)
        withheld = rng.sample(comm, round(options.withhold * len(comm))) if options.withhold > 0 else []
        self.withheld: frozenset[int] = frozenset(n.index for n in withheld)
        self.by_step: dict[tuple, Node] = {}
        self.by_order: dict[tuple, Node] = {}
        per_step: dict[tuple, int] = {}
        per_run: dict[tuple, int] = {}
        for n in comm:
            sig = n.signature(graph.groups)
            k1, k2 = (n.step, n.group_id, sig), (n.group_id, sig)
            self.by_step[(*k1, per_step.get(k1, 0))] = n
            self.by_order[(*k2, per_run.get(k2, 0))] = n
            per_step[k1] = per_step.get(k1, 0) + 1
            per_run[k2] = per_run.get(k2, 0) + 1
        # Under ``estimated`` the rank's own records are not history: its durations are what is estimated.
        exclude = {(rank, n.index) for n in comm} if options.timing == "estimated" else {
            (rank, i) for i in self.withheld}
        self.estimator = DurationEstimator(() if options.timing == "none" else samples_from_graph(
            graph, ranks_per_node=self.ranks_per_node, exclude=frozenset(exclude)))
        self.timing = options.timing

    def duration_ns(self, record: Node | None, features: CommFeatures) -> tuple[int, str]:
        """(duration, source): ``recorded`` or ``estimated`` (or ``none``: untimed, or no history: 0 ns)."""
        if self.timing == "none":
            return 0, "none"
        usable = record is not None and record.duration_ns >= 0 and record.index not in self.withheld
        if usable and self.timing == "recorded":
            return record.duration_ns, "recorded"
        est = self.estimator.estimate(features)
        return (0, "none") if est is None else (est, "estimated")


class RecordedEngine(CommEngine):
    name = "recorded"

    def __init__(self, options: ReplayOptions, *, current_step: Callable[[], int] | None = None) -> None:
        if options.timing not in TIMINGS:
            raise ValueError(f"timing {options.timing!r}: expected one of {', '.join(TIMINGS)}")
        run = Path(options.run_dir)
        self.options = options
        self.index = ReplayIndex(read_graph(run / "graph" / options.graph), options)
        self._current_step = current_step or _recorder_step
        self._payloads = self._load_payloads(run) if options.values else {}
        self._step_counts: dict[tuple, int] = {}
        self._run_counts: dict[tuple, int] = {}
        self._position: dict[int, int] = {}
        self._last_deadline: dict[tuple, int] = {}
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopped = False
        self._slack_ns = 0
        self.late_ns: list[int] = []
        """How late each completion fired (host scheduling), for the log."""
        self.counts = {"recorded": 0, "estimated": 0, "none": 0, "unmatched": 0, "restored": 0}
        self._thread = threading.Thread(target=self._timer_loop, name="prism-replay-timer", daemon=True)
        self._thread.start()

    # -- values ----------------------------------------------------------------------------------
    def _load_payloads(self, run: Path) -> dict[str, list[torch.Tensor]]:
        """Every recorded output of this rank, loaded before the script starts (off the timed path)."""
        rank = self.options.rank
        directory = record_payload_dir(run, rank)
        prefix = ""
        if not (directory / "index.json").is_file():
            directory, prefix = run / "payloads", f"{rank}/"  # a collection's values
            if not (directory / "index.json").is_file():
                raise ReplayValueError(f"{run}: no recorded values for rank {rank} (neither "
                                       f"{record_payload_dir(run, rank)} nor {directory}/index.json); record "
                                       f"with `prism record --payloads` or collect the run")
        index = load_index(directory)
        cache: dict[str, list[torch.Tensor]] = {}
        out: dict[str, list[torch.Tensor]] = {}
        for key, entry in index.items():
            if not key.startswith(prefix) or "outputs" not in entry:
                continue
            digest = entry["outputs"]
            if digest not in cache:
                cache[digest] = load_payload(directory, digest)
            out[key] = cache[digest]
        log.info("rank %d: %d recorded outputs loaded from %s", rank, len(out), directory)
        return out

    def _restore(self, req: CommRequest, record: Node | None) -> None:
        """Copy the recorded outputs into the script's output tensors (a breakpoint here shows both)."""
        if record is None or record.kind is NodeKind.SEND or not req.outputs:
            _fill(req)
            return
        key = op_key(self.options.rank, record.group_id, record.seq, record.kind.value)
        recorded = self._payloads.get(key)
        if recorded is None:
            raise ReplayValueError(f"rank {self.options.rank}: no recorded output for op {key} "
                                   f"({record.op.value if record.op else ''} at {record.call_site or '?'})")
        if len(recorded) != len(req.outputs) or any(r.shape != o.shape for r, o in zip(recorded, req.outputs)):
            raise ReplayValueError(
                f"rank {self.options.rank}: op {key} recorded {[tuple(r.shape) for r in recorded]} but the script "
                f"asks for {[tuple(o.shape) for o in req.outputs]}")
        for out, value in zip(req.outputs, recorded, strict=True):
            out.copy_(value)
        self.counts["restored"] += 1

    # -- alignment -------------------------------------------------------------------------------
    def align(self, req: CommRequest) -> tuple[Node | None, CommFeatures]:
        step = self._current_step()
        sig = request_signature(req)
        k1, k2 = (step, req.group.group_id, sig), (req.group.group_id, sig)
        n1, n2 = self._step_counts.get(k1, 0), self._run_counts.get(k2, 0)
        self._step_counts[k1], self._run_counts[k2] = n1 + 1, n2 + 1
        # The step's own record first; the run-wide order when the script marks no steps itself
        # (the recorded steps were inferred from the comm period after the run).
        record = self.index.by_step.get((*k1, n1)) or self.index.by_order.get((*k2, n2))
        position = self._position.get(step, 0)
        self._position[step] = position + 1
        kind = {CommOp.SEND: NodeKind.SEND, CommOp.RECV: NodeKind.RECV}.get(req.op, NodeKind.COLLECTIVE)
        probe = Node(rank=self.options.rank, index=-1, kind=kind, op=req.op, group_id=req.group.group_id,
                     peer=req.peer if kind is not NodeKind.COLLECTIVE else req.root,
                     size_bytes=sum(t.numel() * t.element_size() for t in (req.inputs if kind is not NodeKind.RECV
                                                                           else req.outputs)), step=step)
        features = features_of(probe, members=req.group.ranks, ranks_per_node=self.index.ranks_per_node,
                               position=position)
        return record, features

    # -- submission and completion ---------------------------------------------------------------
    def submit(self, req: CommRequest) -> torch.futures.Future:
        now = time.perf_counter_ns()
        record, features = self.align(req)
        if record is None:
            self.counts["unmatched"] += 1
            log.debug("rank %d: no record for %s on %s (seq %d)", self.options.rank, req.op.value,
                      req.group.group_id, req.seq)
        duration, source = self.index.duration_ns(record, features)
        self.counts[source] += 1
        stream = _stream(req.op, req.group.group_id, req.peer)
        deadline = max(now + duration, self._last_deadline.get(stream, 0))
        self._last_deadline[stream] = deadline
        future: torch.futures.Future = torch.futures.Future()
        held = [req]

        def complete() -> None:
            (r,) = held
            held.clear()  # the op's tensors are released before the script wakes (memtrack)
            try:
                with torch.no_grad(), untracked():
                    if self.options.values:
                        self._restore(r, record)
                    else:
                        _fill(r)
                outputs, extra = r.outputs, r.extra
                del r
                complete_op(future, outputs, extra)
            except Exception as e:  # noqa: BLE001 - handed to the script through its future
                if future.done():
                    raise
                future.set_exception(e)

        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), complete))
            self._cv.notify()
        return future

    def _timer_loop(self) -> None:
        while True:
            with self._cv:
                # Wake ``slack`` early: the thread's own wake-up latency (host scheduling, the GIL),
                # measured as it runs, is not the recorded op's and would add to every completion.
                while not self._stopped and (not self._heap or
                                             self._heap[0][0] - self._slack_ns > time.perf_counter_ns()):
                    if self._heap:
                        self._cv.wait(timeout=(self._heap[0][0] - self._slack_ns - time.perf_counter_ns()) / 1e9)
                    else:
                        self._cv.wait()
                if self._stopped and not self._heap:
                    return
                deadline, _, complete = heapq.heappop(self._heap)
                planned = deadline - self._slack_ns
            now = time.perf_counter_ns()
            if now - planned < _MAX_SLACK_NS:  # a wake-up, not a backlog of overdue ops
                self._slack_ns += (max(0, now - planned) - self._slack_ns) // 8
            self.late_ns.append(now - deadline)
            try:
                complete()
            except Exception:  # noqa: BLE001 - one op's failure must not stop the others' completions
                log.exception("rank %d replay: completing an op failed after its future was set",
                              self.options.rank)
            del complete

    def shutdown(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=5)
        late = sorted(self.late_ns) or [0]
        log.info("rank %d replay: %s; completions late by median %.3f ms, max %.3f ms", self.options.rank,
                 self.counts, late[len(late) // 2] / 1e6, late[-1] / 1e6)


def _recorder_step() -> int:
    from .. import backend

    return backend.get_context().observer.current_step
