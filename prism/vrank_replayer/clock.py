"""When a virtual rank issues an op: the replayer asks its clock before it plays a vrank's part.

:class:`AsapClock` answers at once (calibration slices, value-only emulation). :class:`TimedClock`
is the real-time co-simulation of DESIGN §8: each vrank advances through the *timed* graph
(calibrated compute durations, the predicted waits on other vranks) in real time, and its clock is
re-anchored on the real events it shares with the sandbox (docs/emulate.md). :class:`CoSimClock`
(the replayer's default) replaces the per-vrank offsets by an online discrete-event simulation of
all vranks whose ops with the sandbox complete at their real times, so vranks follow a sandbox
that runs a changed program through any chain of dependencies (docs/whatif.md).

The arithmetic (:class:`VrankSchedule`, :meth:`TimedClock.issue_at_ns`,
:meth:`TimedClock.complete_at`) is pure and takes times as arguments; only
:meth:`TimedClock.wait_until_issue` reads the wall clock and sleeps.

Model, per vrank ``v`` (times in ns; ``I``/``E`` are the timed graph's predicted issue/end of an
op, ``R`` the predicted time ``v`` reaches the point where it waits for the op):

* ``v`` keeps an *offset* (real − predicted); op ``j`` is issued at ``I_j + offset``. Before its
  first real event the offset is unknown and ``v`` answers as soon as it can (the first op of a
  job is typically a barrier or a collective that every rank reaches after start-up).
* When an op ``i`` that ``v`` later waits for (a synchronous op, or one a WAIT targets) completes
  for real at ``C``, ``v``'s real release from that wait is ``max(C, R_i + offset)`` while the
  prediction released it at ``max(E_i, R_i)``; the offset becomes their difference. So a sandbox
  rank that is late delays ``v`` exactly when the prediction had ``v`` waiting on it, and ``v``
  keeps its own (calibrated) pace otherwise.
* ``v`` does not issue ``j`` before every op it waits for between ``i`` and ``j`` in its program
  has completed for real (causality: the real ``v`` is blocked there). Only ops whose completion the
  replayer will see count: messages with a sandbox peer always; collectives it serves always when
  the replayer reports each one for every vrank of the group (``collectives_told``: a completion,
  marked done once the replayer finished it: :meth:`TimedClock.collective_done`), else once announced.
* Through the job's first step, when it is a warm-up step (``warmup_steps`` ≥ 1), a vrank keeps
  the sandbox's pace: it issues at once and re-anchors on each real completion as if it had been
  ready for it. Its later steps begin where its last anchor of that step released it: until its
  next anchor an op goes at that release plus its predicted time since the end of the first step.
  The recording's first step holds start-up work (allocation, first calls, the first optimizer
  step, a launch of W processes contending for the host) that the emulation's sandbox does not
  repeat at the same length; a vrank that kept its calibrated pace through it held the first
  measured step back by up to seconds. Further warm-up steps are played on the timed clock: each
  sandbox rank got through the first step at its own pace, so their phase is not the timed
  graph's, and the step after the paced one absorbs the difference (pipelines on 16 cores,
  session 34: the later stage's first measured step 99–100 ms against 110 real on synthetic,
  141–147 against 151.5 on pp 1F1B, every emulation, with two warm-up steps both paced).
* A real rank issues op ``j`` at its time: its own wake-up latency is inside the calibrated
  durations. The replayer's thread would add its own on top, so it asks to be woken early by the
  median lateness of its recent timed wake-ups (:meth:`TimedClock.wake_lead_ns`).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prism.core.errors import GraphError
from prism.graph.livesim import LiveSim, op_key
from prism.graph.simulate import estimate_transfers
from prism.graph.records import Graph, Node, NodeKind

__all__ = ["Clock", "AsapClock", "CoSimClock", "TimedClock", "VrankOp", "VrankSchedule", "op_key"]

OpKey = tuple
_WAKEUPS_KEPT = 64
_MAX_LEAD_NS = 2e6


class Clock(Protocol):
    def wait_until_issue(self, vrank: int, node: Node) -> None:
        """Block until virtual rank ``vrank`` issues the op ``node`` identifies (its group and
        sequence, or its message identity; the node is the one the graph records for a sandbox
        member of the op: identities are shared by all members)."""

    def on_complete(self, vrank: int, node: Node) -> None:
        """The vrank's part of ``node`` is done (transfers with the sandbox finished)."""

    def collective_done(self, node: Node) -> None:
        """The replayer finished the collective ``node``: every vrank's part in it is over (played,
        or pruned)."""

    def transfer_ns(self, node: Node) -> int | None:
        """The collective instance's transfer time in the timed graph (None: no timed graph)."""


class AsapClock:
    """Bare-graph replay (calibration slices, value-only emulation): a vrank issues its next op
    as soon as the sandbox side is ready for it."""

    def wait_until_issue(self, vrank: int, node: Node) -> None:
        return None

    def on_complete(self, vrank: int, node: Node) -> None:
        return None

    def collective_done(self, node: Node) -> None:
        return None

    def transfer_ns(self, node: Node) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class VrankOp:
    """One comm op of a vrank in the timed graph."""

    index: int
    issue_ns: int
    """I: predicted issue time."""
    end_ns: int
    """E: predicted completion."""
    wait_ns: int
    """R: predicted time the vrank reaches its wait for this op (-1: never waits for it)."""
    blockers: tuple[int, ...]
    """Indices of earlier ops the vrank waits for before it issues this one (since the start of the
    previous step)."""
    sure: bool
    """The replayer always sees this op's completion (a message with a sandbox peer)."""
    step: int = 0
    """The vrank's step the op belongs to."""
    key: OpKey = ()
    """The op's identity (shared by all members)."""


def _measured_start_ns(nodes: tuple[Node, ...], paced_steps: int) -> int:
    """Predicted end of the last paced step (0 without paced steps or step marks)."""
    ends = [n.start_ns for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end" and n.step < paced_steps]
    return max(ends, default=0)


def _sure(n: Node, sandbox: frozenset[int], served: frozenset[OpKey] | None, collectives_told: bool) -> bool:
    if served is not None and op_key(n) not in served:
        return False
    if n.kind is NodeKind.COLLECTIVE:
        return collectives_told and served is not None
    return n.peer in sandbox


@dataclass(frozen=True, slots=True)
class VrankSchedule:
    """What the clock knows of one vrank: its comm ops by identity."""

    rank: int
    ops: dict[OpKey, VrankOp]
    by_index: dict[int, VrankOp]

    @staticmethod
    def from_nodes(rank: int, nodes: tuple[Node, ...], sandbox: Iterable[int],
                   served: frozenset[OpKey] | None = None, collectives_told: bool = False) -> VrankSchedule:
        """``served``: the ops whose completion this replayer sees (None: every op with the sandbox).
        ``collectives_told``: the replayer reports every served collective for each of its vranks —
        a completion where the vrank takes part, :meth:`TimedClock.collective_done` for all — so
        those are sure too (else a collective counts once announced)."""
        sandbox = frozenset(sandbox)
        if any(n.is_comm and n.start_ns < 0 for n in nodes):
            raise GraphError(f"rank {rank}: the timed graph has comm nodes without predicted times")
        wait_at: dict[int, int] = {}
        waited_before: dict[int, tuple[int, ...]] = {}  # comm index -> ops waited for before it
        waited: list[tuple[int, int]] = []  # (op index, step of the wait), in program order
        for n in nodes:
            if n.kind is NodeKind.WAIT and n.target >= 0:
                wait_at.setdefault(n.target, n.start_ns)
                waited.append((n.target, n.step))
            elif n.is_comm:
                # Everything waited for since the start of the previous step (older waits are
                # behind an observable op of their own or long done).
                while waited and waited[0][1] < n.step - 1:
                    waited.pop(0)
                waited_before[n.index] = tuple(i for i, _ in waited)
                if not n.is_async:
                    wait_at[n.index] = n.start_ns
                    waited.append((n.index, n.step))
        ops, by_index = {}, {}
        for n in nodes:
            if not n.is_comm:
                continue
            op = VrankOp(index=n.index, issue_ns=n.start_ns, end_ns=n.end_ns, wait_ns=wait_at.get(n.index, -1),
                         blockers=tuple(waited_before[n.index]),
                         sure=_sure(n, sandbox, served, collectives_told), step=n.step, key=op_key(n))
            ops[op_key(n)] = op
            by_index[n.index] = op
        return VrankSchedule(rank, ops, by_index)


class TimedClock:
    """Real-time co-simulation clock over a timed graph (module docstring)."""

    def __init__(self, timed: Graph, sandbox: Iterable[int], *, vranks: Iterable[int] | None = None,
                 served: Iterable[OpKey] | None = None, timeout_s: float = 600.0, warmup_steps: int = 0,
                 collectives_told: bool = False) -> None:
        sandbox = frozenset(sandbox)
        self.paced_steps = min(warmup_steps, 1)
        """Steps through which a vrank keeps the sandbox's pace (module docstring)."""
        self._measured_anchor: set[int] = set()
        """Vranks whose offset was set by an op after the paced steps."""
        wanted = sorted(set(vranks) if vranks is not None else set(timed.nodes) - sandbox)
        missing = [v for v in wanted if v not in timed.nodes]
        if missing:
            raise GraphError(f"the timed graph has no nodes for vranks {missing}")
        served = frozenset(served) if served is not None else None
        self.schedules = {v: VrankSchedule.from_nodes(v, timed.nodes[v], sandbox, served, collectives_told)
                          for v in wanted}
        self._timed = timed
        self._transfers: dict[tuple[str, int], int] | None = None
        self.timeout_s = timeout_s
        self._measured_start_ns = {v: _measured_start_ns(timed.nodes[v], self.paced_steps) for v in wanted}
        """Predicted start of each vrank's first step after the paced ones (the end of the last)."""
        self._warmup_release: dict[int, float] = {}
        """Real release of each vrank's last anchor in the paced steps: where its timed steps begin."""
        self._offset: dict[int, float] = {}
        self._announced: set[tuple[int, int]] = set()
        self._completed: set[tuple[int, int]] = set()
        self._done_keys: set[OpKey] = set()
        """Collectives the replayer finished (:meth:`collective_done`)."""
        self._lock = threading.Lock()
        # One condition per vrank: a completion re-anchors only its own vrank, so only the threads
        # waiting to issue that vrank's ops wake up (not every channel thread of the replayer).
        self._conds = {v: threading.Condition(self._lock) for v in wanted}
        self._group_vranks = {gid: tuple(v for v in info.ranks if v in self._conds) for gid, info in timed.groups.items()}
        self.idle_wakeups = 0
        """Times a thread waiting to issue a vrank's op woke up (notified or timed out) and waited again."""
        self.events: list[tuple[int, int, str, int]] = []
        """(vrank, op index, ``issue`` | ``complete``, perf_counter_ns) of the ops played for real, and
        (vrank, op index, ``anchor``, the new offset in ns) at each re-anchoring."""
        self._wakeups: deque[float] = deque(maxlen=_WAKEUPS_KEPT)
        self._lead_ns = 0.0

    # -------------------------------------------------------------------------- pure arithmetic

    def _op(self, vrank: int, node: Node) -> VrankOp:
        try:
            return self.schedules[vrank].ops[op_key(node)]
        except KeyError:
            raise GraphError(f"vrank {vrank}: the timed graph has no op {node.kind.value} g{node.group_id}:{node.seq} "
                             f"(from rank {node.rank}); calibrate this run again") from None

    def offset_ns(self, vrank: int) -> float | None:
        """Real − predicted time of ``vrank`` (None before its first real event)."""
        return self._offset.get(vrank)

    def blocked_on(self, vrank: int, node: Node) -> list[int]:
        """Ops ``vrank`` waits for before issuing ``node`` whose real completion is still due."""
        return self._blocked_on(vrank, self._op(vrank, node))

    def _blocked_on(self, vrank: int, op: VrankOp) -> list[int]:
        sched = self.schedules[vrank]
        return [i for i in op.blockers if (vrank, i) not in self._completed
                and sched.by_index[i].key not in self._done_keys
                and (sched.by_index[i].sure or (vrank, i) in self._announced)]

    def issue_at_ns(self, vrank: int, node: Node) -> float:
        """Real time at which ``vrank`` issues ``node`` (−inf: at once)."""
        return self._issue_at_ns(vrank, self._op(vrank, node))

    def _issue_at_ns(self, vrank: int, op: VrankOp) -> float:
        offset = self._offset.get(vrank)
        if offset is None:
            return -math.inf
        if self._keeps_pace(vrank):
            return self._from_warmup_ns(vrank, op.step, op.issue_ns)
        return op.issue_ns + offset

    def _from_warmup_ns(self, vrank: int, step: int, predicted_ns: int) -> float:
        """Before its first anchor after the paced steps: a paced op goes at once; a later one at its
        place in the timed graph, counted from the vrank's last release in the paced steps (the tail
        of the recorded first step — first-call and start-up work — is not replayed)."""
        entry = self._warmup_release.get(vrank)
        if step < self.paced_steps or entry is None:
            return -math.inf
        return entry + (predicted_ns - self._measured_start_ns[vrank])

    def _keeps_pace(self, vrank: int) -> bool:
        """Before its first anchor after the paced steps a vrank follows the sandbox (module
        docstring); its paced ops all come before that anchor, in program order."""
        return self.paced_steps > 0 and vrank not in self._measured_anchor

    def complete_at(self, vrank: int, node: Node, real_ns: float) -> None:
        """Record that ``vrank``'s part of ``node`` completed at real time ``real_ns``."""
        self._complete_at(vrank, self._op(vrank, node), real_ns)

    def _complete_at(self, vrank: int, op: VrankOp, real_ns: float, *, event: str | None = None) -> None:
        """``event``: also log the completion as that event, under the same lock."""
        with self._lock:
            self._completed.add((vrank, op.index))
            if op.wait_ns >= 0:
                offset = self._offset.get(vrank)
                if offset is None:
                    reach = -math.inf
                elif self._keeps_pace(vrank):  # the old offset still holds the recorded warm-up
                    reach = self._from_warmup_ns(vrank, op.step, op.wait_ns)
                else:
                    reach = op.wait_ns + offset
                release_real = max(real_ns, reach)
                release_pred = max(op.end_ns, op.wait_ns)
                self._offset[vrank] = release_real - release_pred
                if op.step >= self.paced_steps:
                    self._measured_anchor.add(vrank)
                else:
                    self._warmup_release[vrank] = max(release_real, self._warmup_release.get(vrank, -math.inf))
                self.events.append((vrank, op.index, "anchor", int(self._offset[vrank])))
            if event is not None:
                self.events.append((vrank, op.index, event, real_ns))
            self._conds[vrank].notify_all()

    def collective_done(self, node: Node) -> None:
        """The replayer finished the collective ``node``: what waits for a vrank's part in it need not
        wait any longer (a pruned vrank's part included); no re-anchoring. One mark per op, not one
        per member of the group."""
        with self._lock:
            self._done_keys.add(op_key(node))
            # Only the group's vranks wait for it (a vrank's blockers are its own ops). Waking every
            # channel thread at each collective had them take the GIL in turn just when another
            # channel's op was in flight (docs/emulate.md, session 43).
            for v in self._group_vranks.get(node.group_id, tuple(self._conds)):
                self._conds[v].notify_all()

    def transfer_ns(self, node: Node) -> int | None:
        with self._lock:
            if self._transfers is None:  # only the CPU lanes' transfer hold asks: no cost elsewhere
                self._transfers = estimate_transfers(self._timed).collective_ns
            return self._transfers.get((node.group_id, node.seq))

    # ------------------------------------------------------------------------------ real time

    def wait_until_issue(self, vrank: int, node: Node) -> None:
        op = self._op(vrank, node)  # once per op: the replayer's Python per message counts (docs/emulate.md)
        deadline = time.monotonic() + self.timeout_s
        cond = self._conds[vrank]
        waits = 0
        with cond:
            self._announced.add((vrank, op.index))
            while True:
                if time.monotonic() > deadline:
                    raise GraphError(f"vrank {vrank}: waited {self.timeout_s:.0f} s to issue {node.kind.value} "
                                     f"g{node.group_id}:{node.seq}; still due: ops {self._blocked_on(vrank, op)}")
                if op.blockers and self._blocked_on(vrank, op):
                    waits += 1
                    cond.wait(timeout=1.0)
                    continue
                now = time.perf_counter_ns()
                wake_ns = self._issue_at_ns(vrank, op) - self._lead_ns
                if now >= wake_ns:
                    self.events.append((vrank, op.index, "issue", now))
                    self.idle_wakeups += max(0, waits - 1)
                    return
                waits += 1
                timeout_s = min((wake_ns - now) / 1e9, 1.0)
                if not cond.wait(timeout=timeout_s):  # timed out: how late did this thread wake up?
                    self._woke_late(time.perf_counter_ns() - now - timeout_s * 1e9)

    def wake_lead_ns(self) -> float:
        """How early a vrank's thread asks to be woken: the median lateness of its recent timed
        wake-ups. A real rank issues at the predicted time (its own wake-up latency is inside the
        calibrated durations); the replayer's thread would add its own on top (a few hundred µs
        per op on a loaded host, p90 ~0.8 ms), once per vrank op along the pipeline."""
        return self._lead_ns

    def _woke_late(self, late_ns: float) -> None:
        self._wakeups.append(max(0.0, late_ns))
        self._lead_ns = min(statistics.median(self._wakeups), _MAX_LEAD_NS)

    def on_complete(self, vrank: int, node: Node) -> None:
        self._complete_at(vrank, self._op(vrank, node), time.perf_counter_ns(), event="complete")


class CoSimClock:
    """Real-time co-simulation that follows the sandbox (docs/whatif.md): the vranks are a
    :class:`~prism.graph.livesim.LiveSim` of the timed graph whose ops with the sandbox complete at
    the real times the replayer reports. A vrank op is issued at its simulated time; when a sandbox
    rank is earlier or later than the timed graph (a changed program), every vrank that depends on
    it through any chain of ops moves with it, and the others keep their calibrated pace."""

    def __init__(self, timed: Graph, sandbox: Iterable[int], *, served: Iterable[OpKey] | None = None,
                 timeout_s: float = 600.0) -> None:
        self.sim = LiveSim(timed, sandbox, served=served)
        self._timed = timed
        self._transfers: dict[tuple[str, int], int] | None = None
        """Every member's shortest duration per collective, the sandbox's too (the sim has only the
        vranks'); built when the CPU lanes' transfer hold first asks."""
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self.events: list[tuple[int, int, str, int]] = []
        """(vrank, op index, ``issue`` | ``complete``, perf_counter_ns) of the ops played for real."""
        self._wakeups: deque[float] = deque(maxlen=_WAKEUPS_KEPT)
        self._lead_ns = 0.0

    def issue_at_ns(self, vrank: int, node: Node) -> float | None:
        """Real time at which ``vrank`` issues ``node`` (None: not known yet)."""
        with self._cond:
            return self.sim.issue_ns(vrank, op_key(node))

    def wait_until_issue(self, vrank: int, node: Node) -> None:
        key = op_key(node)
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self.sim.announce(vrank, key)
            while True:
                if time.monotonic() > deadline:
                    raise GraphError(f"vrank {vrank}: waited {self.timeout_s:.0f} s to issue {node.kind.value} "
                                     f"g{node.group_id}:{node.seq}; the vranks it depends on never got there")
                due = self.sim.issue_ns(vrank, key)
                if due is None:
                    self._cond.wait(timeout=1.0)
                    continue
                now = time.perf_counter_ns()
                wake_ns = due - self._lead_ns
                if now >= wake_ns:
                    self.events.append((vrank, self.sim.index_of[(vrank, key)], "issue", now))
                    return
                timeout_s = min((wake_ns - now) / 1e9, 1.0)
                if not self._cond.wait(timeout=timeout_s):
                    self._woke_late(time.perf_counter_ns() - now - timeout_s * 1e9)

    def wake_lead_ns(self) -> float:
        """As :meth:`TimedClock.wake_lead_ns`."""
        return self._lead_ns

    def _woke_late(self, late_ns: float) -> None:
        self._wakeups.append(max(0.0, late_ns))
        self._lead_ns = min(statistics.median(self._wakeups), _MAX_LEAD_NS)

    def complete_at(self, vrank: int, node: Node, real_ns: int) -> None:
        key = op_key(node)
        with self._cond:
            self.sim.report(vrank, key, real_ns)
            self.events.append((vrank, self.sim.index_of[(vrank, key)], "complete", real_ns))
            self._cond.notify_all()

    def on_complete(self, vrank: int, node: Node) -> None:
        self.complete_at(vrank, node, time.perf_counter_ns())

    def collective_done(self, node: Node) -> None:
        """Pruned vranks of a collective: the simulation already completes them without the replayer."""
        return None

    def transfer_ns(self, node: Node) -> int | None:
        with self._cond:
            if self._transfers is None:
                self._transfers = estimate_transfers(self._timed).collective_ns
            return self._transfers.get((node.group_id, node.seq))

    def simulated(self) -> dict[str, list[tuple[int, int, int]]]:
        """Per vrank, ``(node index, reached, done)`` on the real clock of every node the
        simulation got to (the vranks' emulated timeline)."""
        with self._cond:
            sim = self.sim
            return {str(r): [(i, sim.issue[r][i], sim.end[r][i]) for i in range(len(sim.issue[r]))
                             if sim.issue[r][i] > 0 and sim.end[r][i] >= sim.issue[r][i]]
                    for r in sim.ranks}
