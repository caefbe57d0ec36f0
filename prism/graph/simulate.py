"""The discrete-event pass of DESIGN §7.2: predict each rank's timeline from a graph.

Model (a pure function of the graph; all ranks start at t=0):

* Each rank has a **compute lane** that walks its nodes in program order. COMPUTE takes its
  ``duration_ns``; MARK takes no time; unknown durations (-1) count as 0.
* Each rank has one **collective lane per process group**: a rank's collectives on a group run in
  the order it issued them. A collective instance ``(group, seq)`` starts when every member has
  issued it and it is at the head of every member's lane for that group (all their earlier
  collectives on the group finished), and lasts its transfer time.
* Point to point: a SEND's transfer starts when its per-peer channel ``(rank, group, peer)`` is
  free and lasts its transfer time; a RECV completes when the transfer ends (or at its issue).
  When does the transfer start? ``graph.meta["p2p"]`` says:

  - ``rendezvous`` (what calibration sets for a CPU job, whose messages go over gloo): when both
    halves are issued, the SEND and its RECV; both complete when it ends. gloo's send waits for
    the receiver to post its buffer (its pairs keep a send pending until the peer's "ready to
    receive"; an ``isend`` waited before the peer's ``recv`` deadlocks, however small): in a
    recorded 1F1B pipeline an ``isend`` whose receiver posted 95 ms later completed then.
  - otherwise **eager**: when the SEND is issued, whether or not the RECV is (the idealised
    programs of :mod:`prism.analysis.inject` wait on a send before the peer receives; NCCL jobs
    keep this model until it is measured there).

  P2P does not queue on the group's collective lane: NCCL runs P2P on per-peer streams and gloo's
  send/recv are independent, so queueing them behind collectives would report deadlocks (e.g.
  ``batch_isend_irecv`` rings) the real job does not have.
* A synchronous comm node (``is_async`` False) blocks the compute lane until it completes; an
  asynchronous one lets the rank continue until a WAIT targets it. An asynchronous comm that is
  never waited must complete before the rank's next ``step_end`` MARK (and before the rank ends).
* Step ``k``'s time is from ``step_end`` k-1 (step 0: the rank's start) to ``step_end`` k.

Transfer times come from the recording itself: a collective instance takes the minimum observed
duration over its members (the last to arrive waits least, so its duration is closest to the pure
transfer). A member's observed duration of an async collective issued while its previous one on
the group was still running starts when that one ended, where the member's clock says so
(``start_ns`` known): its recorded ``duration_ns`` also holds the time it queued behind it, which
the lane above adds again (a DDP step's bucket all-reduces, issued within a ms of each other, would
otherwise take the sum of their queueing times: in a calibration slice of examples/ddp the step's
last all-reduce ended 166 ms after its issue in the timed graph against 85 ms in the slice). A message, when the recording's ranks share one clock
(``graph.meta["clock"] == "shared"``), takes its RECV's end minus ``max(send start, recv start)``;
otherwise the smaller of the SEND's and the RECV's ``duration_ns`` (the later side waited least).

The pass is event driven (a heap of rank clocks) and linear in the number of nodes, up to the heap's
log factor. If no rank can progress while some have not finished, it raises GraphError listing each
stuck rank's pending node and what it waits for.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections import deque
from dataclasses import dataclass, field

from prism.core.errors import GraphError
from prism.graph.records import Graph, Node, NodeKind
from prism.graph.text import format_node

__all__ = [
    "RankTimeline",
    "SimResult",
    "StepRow",
    "Transfers",
    "estimate_transfers",
    "simulate",
    "timed_graph",
    "compare_steps",
]

log = logging.getLogger(__name__)

_COMPUTE = NodeKind.COMPUTE
_COLLECTIVE = NodeKind.COLLECTIVE
_SEND = NodeKind.SEND
_RECV = NodeKind.RECV
_WAIT = NodeKind.WAIT
_MARK = NodeKind.MARK


@dataclass(frozen=True, slots=True)
class RankTimeline:
    """Predicted times of one rank's nodes (ns from the common start), index-aligned with its list.

    COMPUTE: start/end on the compute lane. Comm: ``issue_ns`` when the rank issued it,
    ``start_ns``/``end_ns`` of its transfer (RECV: from issue to data available). WAIT: from
    reaching it to being released. MARK: all three equal.
    """

    rank: int
    issue_ns: tuple[int, ...]
    start_ns: tuple[int, ...]
    end_ns: tuple[int, ...]
    step_end_ns: tuple[int, ...]
    """Time of each ``step_end`` MARK, in order."""
    step_times_ns: tuple[int, ...]
    """Step k: step_end k minus step_end k-1 (step 0: from 0)."""
    total_ns: int
    """When the rank's last node and all its outstanding comm are done."""


@dataclass(frozen=True, slots=True)
class SimResult:
    ranks: dict[int, RankTimeline]

    @property
    def total_ns(self) -> int:
        """The makespan: the last rank's total."""
        return max((t.total_ns for t in self.ranks.values()), default=0)

    def step_times_ns(self, rank: int) -> tuple[int, ...]:
        return self.ranks[rank].step_times_ns


@dataclass(frozen=True, slots=True)
class StepRow:
    """Predicted vs measured time of one step of one rank (-1: unknown)."""

    rank: int
    step: int
    predicted_ns: int
    measured_ns: int
    source: str = ""
    """Where measured_ns comes from: ``summary`` (RankSummary.step_times_ns) or ``marks``."""

    @property
    def rel_error(self) -> float | None:
        if self.predicted_ns < 0 or self.measured_ns <= 0:
            return None
        return (self.predicted_ns - self.measured_ns) / self.measured_ns


# --- transfer time estimates ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transfers:
    """Estimated transfer time per collective instance and per P2P message."""

    collective_ns: dict[tuple[str, int], int] = field(default_factory=dict)
    message_ns: dict[tuple[int, int, str, int], int] = field(default_factory=dict)


def _message_key(n: Node) -> tuple[int, int, str, int]:
    if n.kind is _SEND:
        return (n.rank, n.peer, n.group_id, n.seq)
    return (n.peer, n.rank, n.group_id, n.seq)


def estimate_transfers(graph: Graph) -> Transfers:
    """Transfer times from the recorded durations (module docstring); unknown → 0."""
    coll: dict[tuple[str, int], int] = {}
    sends: dict[tuple[int, int, str, int], Node] = {}
    recvs: dict[tuple[int, int, str, int], Node] = {}
    for nodes in graph.nodes.values():
        lane_end: dict[str, int] = {}  # this rank's previous collective on each group: when it ended
        for n in nodes:
            kind = n.kind
            if kind is _COLLECTIVE:
                key = (n.group_id, n.seq)
                d = n.duration_ns
                if d >= 0 and n.start_ns >= 0:
                    end = n.start_ns + d
                    d = max(0, end - max(n.start_ns, lane_end.get(n.group_id, n.start_ns)))
                    lane_end[n.group_id] = end
                if d >= 0 and (key not in coll or d < coll[key]):
                    coll[key] = d
                else:
                    coll.setdefault(key, -1)
            elif kind is _SEND:
                sends[_message_key(n)] = n
            elif kind is _RECV:
                recvs[_message_key(n)] = n
    shared_clock = graph.meta.get("clock") == "shared"
    msgs: dict[tuple[int, int, str, int], int] = {}
    for key, s in sends.items():
        r = recvs.get(key)
        if shared_clock and r is not None and r.duration_ns >= 0 and s.start_ns >= 0 and r.start_ns >= 0:
            # One clock: the data arrived at the recv's end; it could not start before both sides
            # had issued their halves.
            msgs[key] = max(0, r.start_ns + r.duration_ns - max(s.start_ns, r.start_ns))
        elif r is not None and r.duration_ns >= 0 and s.duration_ns >= 0:
            # Ranks keep their own clocks, so issue times of two ranks are not comparable; as for a
            # collective, the side that arrived last waited least: its duration is the transfer.
            msgs[key] = min(s.duration_ns, r.duration_ns)
        else:
            msgs[key] = max(0, s.duration_ns)
    return Transfers({k: max(0, v) for k, v in coll.items()}, msgs)


# --- the pass ------------------------------------------------------------------------------------


class _Instance:
    __slots__ = ("key", "ranks", "arrivals", "heads", "transfer_ns", "start_ns", "end_ns")

    def __init__(self, key: tuple[str, int], ranks: tuple[int, ...], transfer_ns: int) -> None:
        self.key = key
        self.ranks = ranks
        self.arrivals: dict[int, tuple[int, int]] = {}  # rank -> (index, issue_ns)
        self.heads = 0  # member lanes on which this instance is first in line
        self.transfer_ns = transfer_ns
        self.start_ns = -1
        self.end_ns = -1


class _Sim:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.transfers = estimate_transfers(graph)
        self.rendezvous = graph.meta.get("p2p") == "rendezvous"
        self.ranks = sorted(graph.nodes)
        self.nodes = {r: graph.nodes[r] for r in self.ranks}
        self.issue = {r: [-1] * len(self.nodes[r]) for r in self.ranks}
        self.start = {r: [-1] * len(self.nodes[r]) for r in self.ranks}
        self.end = {r: [-1] * len(self.nodes[r]) for r in self.ranks}
        self.pc = dict.fromkeys(self.ranks, 0)
        self.clock = dict.fromkeys(self.ranks, 0)
        self.issued = dict.fromkeys(self.ranks, False)  # the node at pc has been issued
        self.outstanding: dict[int, dict[int, None]] = {r: {} for r in self.ranks}
        self.step_ends: dict[int, list[int]] = {r: [] for r in self.ranks}
        self.done: dict[int, int] = {}
        self.blocked: dict[int, tuple[int, int]] = {}  # rank -> comm node it waits for
        self.waiters: dict[tuple[int, int], list[int]] = {}
        self.instances: dict[tuple[str, int], _Instance] = {}
        self.lanes: dict[tuple[int, str], deque[_Instance]] = {}
        self.lane_free: dict[tuple[int, str], int] = {}
        self.p2p_free: dict[tuple[int, str, int], int] = {}
        self.send_end: dict[tuple[int, int, str, int], int] = {}
        """Eager: messages sent before their RECV was issued, and when they arrived."""
        self.pending_send: dict[tuple[int, int, str, int], tuple[int, int, int]] = {}
        """Rendezvous: a SEND issued before its RECV: (rank, index, issue)."""
        self.pending_recv: dict[tuple[int, int, str, int], tuple[int, int]] = {}
        self.heap: list[tuple[int, int]] = [(0, r) for r in self.ranks]

    # completion of comm node (rank, index): release whoever waits on it
    def _complete(self, rank: int, index: int, start: int, end: int) -> None:
        self.start[rank][index] = start
        self.end[rank][index] = end
        for r in self.waiters.pop((rank, index), ()):
            del self.blocked[r]
            heapq.heappush(self.heap, (max(self.clock[r], end), r))

    def _block(self, rank: int, on: tuple[int, int]) -> None:
        self.blocked[rank] = on
        self.waiters.setdefault(on, []).append(rank)

    def _arrive(self, n: Node, t: int) -> None:
        key = (n.group_id, n.seq)
        inst = self.instances.get(key)
        if inst is None:
            group = self.graph.groups.get(n.group_id)
            if group is None:
                raise GraphError(f"r{n.rank}#{n.index}: unknown group {n.group_id!r} [{format_node(n)}]")
            inst = _Instance(key, group.ranks, self.transfers.collective_ns.get(key, 0))
            self.instances[key] = inst
        if n.rank not in inst.ranks:
            raise GraphError(
                f"r{n.rank}#{n.index}: rank {n.rank} is not a member of group {n.group_id!r} "
                f"{list(inst.ranks)} [{format_node(n)}]"
            )
        if n.rank in inst.arrivals or inst.end_ns >= 0:
            raise GraphError(
                f"r{n.rank}#{n.index}: issues collective g{n.group_id}:{n.seq} twice [{format_node(n)}]"
            )
        inst.arrivals[n.rank] = (n.index, t)
        lane = self.lanes.setdefault((n.rank, n.group_id), deque())
        lane.append(inst)
        if len(lane) == 1:
            inst.heads += 1
            if inst.heads == len(inst.ranks):
                self._run_instances(inst)

    def _run_instances(self, first: _Instance) -> None:
        ready = [first]
        while ready:
            inst = ready.pop()
            gid = inst.key[0]
            start = 0
            for r, (_, t) in inst.arrivals.items():
                start = max(start, t, self.lane_free.get((r, gid), 0))
            end = start + inst.transfer_ns
            inst.start_ns, inst.end_ns = start, end
            for r, (index, _) in inst.arrivals.items():
                self.lane_free[(r, gid)] = end
                lane = self.lanes[(r, gid)]
                lane.popleft()
                if lane:
                    nxt = lane[0]
                    nxt.heads += 1
                    if nxt.heads == len(nxt.ranks):
                        ready.append(nxt)
                self._complete(r, index, start, end)

    def _send(self, n: Node, t: int) -> None:
        key = _message_key(n)
        recv = self.pending_recv.pop(key, None)
        if recv is None and self.rendezvous:
            self.pending_send[key] = (n.rank, n.index, t)
            return
        end = self._transfer(key, n, t, recv)
        if recv is None:
            self.send_end[key] = end

    def _recv(self, n: Node, t: int) -> None:
        key = _message_key(n)
        send_end = self.send_end.pop(key, None)
        if send_end is not None:  # eager: the message left already
            self._complete(n.rank, n.index, t, max(t, send_end))
            return
        send = self.pending_send.pop(key, None)
        if send is None:
            self.pending_recv[key] = (n.rank, n.index)
        else:
            rank, index, issued = send
            self._transfer(key, self.nodes[rank][index], issued, (n.rank, n.index))

    def _transfer(self, key: tuple[int, int, str, int], send: Node, send_issue: int,
                  recv: tuple[int, int] | None) -> int:
        """Move a message (the receiver ``recv`` posted, or None: eager, not yet); its end."""
        recv_issue = self.issue[recv[0]][recv[1]] if recv is not None else send_issue
        chan = (send.rank, send.group_id, send.peer)
        start = max(send_issue, self.p2p_free.get(chan, 0), recv_issue if self.rendezvous else send_issue)
        end = start + self.transfers.message_ns.get(key, 0)
        self.p2p_free[chan] = end
        self._complete(send.rank, send.index, start, end)
        if recv is not None:
            self._complete(recv[0], recv[1], recv_issue, max(recv_issue, end))
        return end

    def _settle(self, rank: int) -> bool:
        """Wait for every outstanding async comm of ``rank``; False if one is unfinished."""
        pending = self.outstanding[rank]
        end = self.end[rank]
        clock = self.clock[rank]
        for index in list(pending):
            e = end[index]
            if e < 0:
                self.clock[rank] = clock
                self._block(rank, (rank, index))
                return False
            clock = max(clock, e)
            del pending[index]
        self.clock[rank] = clock
        return True

    def run(self) -> SimResult:
        heap = self.heap
        heapq.heapify(heap)
        while heap:
            _, r = heapq.heappop(heap)
            self._advance(r)
        if len(self.done) != len(self.ranks):
            raise GraphError(self._deadlock_report())
        timelines = {}
        for r in self.ranks:
            ends = self.step_ends[r]
            steps = tuple(b - a for a, b in zip([0, *ends[:-1]], ends))
            timelines[r] = RankTimeline(
                rank=r,
                issue_ns=tuple(self.issue[r]),
                start_ns=tuple(self.start[r]),
                end_ns=tuple(self.end[r]),
                step_end_ns=tuple(ends),
                step_times_ns=steps,
                total_ns=self.done[r],
            )
        return SimResult(timelines)

    def _advance(self, r: int) -> None:
        """Run rank r until it blocks, finishes, or its clock passes the next event in the heap."""
        nodes = self.nodes[r]
        issue, start, end = self.issue[r], self.start[r], self.end[r]
        outstanding = self.outstanding[r]
        heap = self.heap
        clock = self.clock[r]
        i = self.pc[r]
        num = len(nodes)
        while True:
            if heap and clock > heap[0][0]:
                self.pc[r], self.clock[r] = i, clock
                heapq.heappush(heap, (clock, r))
                return
            if i == num:
                self.pc[r], self.clock[r] = i, clock
                if self._settle(r):
                    self.done[r] = self.clock[r]
                return
            n = nodes[i]
            kind = n.kind
            if kind is _COMPUTE:
                issue[i] = start[i] = clock
                clock += max(0, n.duration_ns)
                end[i] = clock
            elif kind is _WAIT:
                t = n.target
                if not 0 <= t < i or not nodes[t].is_comm:
                    raise GraphError(
                        f"r{r}#{i}: WAIT target #{t} is not an earlier comm node of rank {r} "
                        f"[{format_node(n)}]"
                    )
                if issue[i] < 0:
                    issue[i] = start[i] = clock
                if end[t] < 0:
                    self.pc[r], self.clock[r] = i, clock
                    self._block(r, (r, t))
                    return
                clock = max(clock, end[t])
                end[i] = clock
                outstanding.pop(t, None)
            elif kind is _MARK:
                if n.mark == "step_end" and outstanding:
                    self.pc[r], self.clock[r] = i, clock
                    if not self._settle(r):
                        return
                    clock = self.clock[r]
                issue[i] = start[i] = end[i] = clock
                if n.mark == "step_end":
                    self.step_ends[r].append(clock)
            else:  # comm
                if not self.issued[r]:
                    self.issued[r] = True
                    issue[i] = clock
                    if kind is _COLLECTIVE:
                        self._arrive(n, clock)
                    elif kind is _SEND:
                        self._send(n, clock)
                    else:
                        self._recv(n, clock)
                if n.is_async:
                    if end[i] < 0:
                        outstanding[i] = None
                else:
                    if end[i] < 0:
                        self.pc[r], self.clock[r] = i, clock
                        self._block(r, (r, i))
                        return
                    clock = max(clock, end[i])
                self.issued[r] = False
            i += 1

    def _deadlock_report(self) -> str:
        lines = ["deadlock: no rank can progress"]
        for r in self.ranks:
            if r in self.done:
                continue
            i = self.pc[r]
            where = format_node(self.nodes[r][i]) if i < len(self.nodes[r]) else f"r{r} end of program"
            on = self.blocked.get(r)
            why = self._why(on) if on is not None else "not blocked (internal error)"
            lines.append(f"rank {r} at {where} (t={self.clock[r]}ns): {why}")
        return "\n  ".join(lines)

    def _why(self, on: tuple[int, int]) -> str:
        rank, index = on
        n = self.nodes[rank][index]
        label = f"r{rank}#{index} {n.op.value if n.op else n.kind.value}"
        if n.kind is _COLLECTIVE:
            inst = self.instances[(n.group_id, n.seq)]
            missing = [m for m in inst.ranks if m not in inst.arrivals]
            if missing:
                states = ", ".join(self._state(m) for m in missing)
                return f"waits for {label} g{n.group_id}:{n.seq}, not issued by rank(s) {missing} ({states})"
            busy = []
            for m in inst.ranks:
                head = self.lanes[(m, n.group_id)][0]
                if head is not inst:
                    busy.append(f"rank {m}'s lane is held by g{head.key[0]}:{head.key[1]}")
            return (
                f"waits for {label} g{n.group_id}:{n.seq}, queued behind an earlier collective: "
                + "; ".join(busy)
            )
        if n.kind is _RECV:
            return (
                f"waits for {label} <-{n.peer} g{n.group_id}:{n.seq}, never sent "
                f"({self._state(n.peer)})"
            )
        if n.kind is _SEND:
            return (
                f"waits for {label} ->{n.peer} g{n.group_id}:{n.seq}, whose receive was never posted "
                f"({self._state(n.peer)})"
            )
        return f"waits for {label}"

    def _state(self, rank: int) -> str:
        if rank in self.done:
            return f"rank {rank} finished"
        i = self.pc[rank]
        if rank not in self.nodes or i >= len(self.nodes[rank]):
            return f"rank {rank} at end of program"
        return f"rank {rank} stuck at {format_node(self.nodes[rank][i])}"


def simulate(graph: Graph) -> SimResult:
    """Predict every rank's timeline (module docstring). Raises GraphError on deadlock."""
    result = _Sim(graph).run()
    log.debug("simulated %d ranks, makespan %d ns", len(result.ranks), result.total_ns)
    return result


def timed_graph(graph: Graph, sim: SimResult) -> Graph:
    """``graph`` with the predicted times: ``start_ns`` = when each node was reached (issued) and
    ``duration_ns`` = until it completed, as a recording would have them; kind ``timed``."""
    nodes = {}
    for r, ns in graph.nodes.items():
        tl = sim.ranks[r]
        nodes[r] = tuple(
            dataclasses.replace(n, start_ns=tl.issue_ns[i], duration_ns=tl.end_ns[i] - tl.issue_ns[i])
            for i, n in enumerate(ns)
        )
    return dataclasses.replace(graph, nodes=nodes, kind="timed")


def _measured_steps(graph: Graph, rank: int) -> tuple[tuple[int, ...], str]:
    summary = graph.summaries.get(rank)
    if summary is not None and summary.step_times_ns:
        return summary.step_times_ns, "summary"
    ends = [n.start_ns for n in graph.nodes.get(rank, ()) if n.kind is _MARK and n.mark == "step_end"]
    if ends and all(t >= 0 for t in ends):
        return tuple(b - a for a, b in zip([0, *ends[:-1]], ends)), "marks"
    return (), ""


def compare_steps(graph: Graph, sim: SimResult) -> list[StepRow]:
    """One row per (rank, step): predicted step time beside the measured one.

    Measured times come from ``RankSummary.step_times_ns`` when recorded, else from the
    ``start_ns`` of the step_end MARKs (same definition as the prediction).
    """
    rows = []
    for rank in sorted(sim.ranks):
        predicted = sim.ranks[rank].step_times_ns
        measured, source = _measured_steps(graph, rank)
        for step in range(max(len(predicted), len(measured))):
            rows.append(
                StepRow(
                    rank=rank,
                    step=step,
                    predicted_ns=predicted[step] if step < len(predicted) else -1,
                    measured_ns=measured[step] if step < len(measured) else -1,
                    source=source if step < len(measured) else "",
                )
            )
    return rows
