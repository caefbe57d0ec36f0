"""Dependency models of one training step and their as-soon-as-possible schedules.

A step is modelled as a DAG of work items with measured durations (compute segments, collective
instances, point-to-point messages) and zero-length events (comm issue and completion, waits, the
step end). Every model is a set of precedence rules; its ASAP schedule is the longest path, so a
model's step time is feasible (the schedule meets every rule) and a lower bound (nothing that
obeys the rules is faster). :class:`Variant` switches the rules on and off; each switch removes
one mechanism, which is how :mod:`prism.analysis.gaps` attributes the step time.

The rules of the ideal model (``program_order=False``) are authored from the parallelism, never
read from the observed order of events (judging a run with dependencies inferred from that same
run would be circular):

* one compute stream per rank: its compute segments run in program order;
* a comm op needs its inputs: it starts after the compute segment that precedes its call;
* a collective instance starts when every member has issued it; a message when its sender has;
* a result is needed where the algorithm consumes it: the data-parallel gradient reduction
  (all_reduce / reduce_scatter on a group of DP peers) only by the optimizer at the step end;
  an FSDP unshard (all_gather), a pipeline RECV, a TP collective by the first compute after the
  point where the program waits for it; a SEND's completion only by the step end;
* the step ends when the rank's compute and every comm op it took part in are done.

The as-programmed model (``program_order=True``) instead lets the host walk the program as
written: a synchronous comm or a WAIT blocks everything after it (what ``prism simulate`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from prism.core.errors import GraphError
from prism.graph.records import CommOp, Graph, Node, NodeKind

__all__ = ["Variant", "StepModel", "Schedule", "Work", "Item", "step_nodes", "measure_work", "balanced_compute",
           "build_step_model"]

_GRADIENT_SYNC = frozenset({CommOp.ALL_REDUCE, CommOp.REDUCE_SCATTER})


@dataclass(frozen=True, slots=True)
class Variant:
    """Which mechanisms a model keeps."""

    program_order: bool = True
    """The host blocks where the program blocks (sync comm, WAIT); else only the authored rules."""
    serialize_lanes: bool = True
    """Collectives of a group run one at a time per member, in issue order; messages one at a time
    per (sender, group, receiver) channel."""
    balanced: bool = False
    """Each compute segment takes the least time any of the rank's DP peers took for it."""
    comm: bool = True
    """False: transfers take no time."""


@dataclass(frozen=True, slots=True)
class Work:
    """Measured durations: compute per node, transfers per collective instance and message."""

    compute_ns: dict[tuple[int, int], int]
    collective_ns: dict[tuple[str, int], int]
    message_ns: dict[tuple[int, int, str, int], int]


@dataclass(frozen=True, slots=True)
class Item:
    """One vertex of a step model: a work item or an event."""

    what: str
    """compute, issue, done, collective, message, wait, step_end."""
    rank: int
    """The rank (collective: its first member; message: the sender)."""
    node: Node | None
    duration_ns: int
    peer: int = -1


@dataclass(frozen=True, slots=True)
class Schedule:
    """ASAP schedule of a step model."""

    finish_ns: dict[int, int]
    step_ns: dict[int, int]
    """Per rank: when its step ends."""
    path: tuple[Item, ...]
    """The longest path to the latest step end."""
    lane_bound_ns: int = 0
    """The comm-lane bound (:meth:`StepModel.schedule`); 0 when not asked for."""
    lane: tuple[Item, ...] = ()
    """The lane's transfers that pin ``lane_bound_ns``."""

    @property
    def path_ns(self) -> int:
        return max(self.step_ns.values(), default=0)

    @property
    def total_ns(self) -> int:
        return max(self.path_ns, self.lane_bound_ns)

    @property
    def chain(self) -> tuple[Item, ...]:
        """The binding chain: the longest path, or the comm lane when its bound is larger."""
        return self.lane if self.lane_bound_ns > self.path_ns else self.path


def _message_key(n: Node) -> tuple[int, int, str, int]:
    return (n.rank, n.peer, n.group_id, n.seq) if n.kind is NodeKind.SEND else (n.peer, n.rank, n.group_id, n.seq)


def step_nodes(graph: Graph, step: int) -> dict[int, tuple[Node, ...]]:
    """Each rank's nodes of ``step`` (nodes before the first boundary count as step 0)."""
    return {r: tuple(n for n in nodes if max(n.step, 0) == step) for r, nodes in graph.nodes.items()}


def measure_work(graph: Graph) -> Work:
    """Durations of every work item, from the observed times.

    A transfer is the time from when it could start (every member issued it and, on its lane, the
    previous op ended) to its earliest completion; this needs the ranks to share one clock
    (``graph.meta["clock"] == "shared"``). Without it, the shortest member's duration (the last
    to arrive waited least).
    """
    shared = graph.meta.get("clock") == "shared"
    compute: dict[tuple[int, int], int] = {}
    members: dict[tuple[str, int], list[Node]] = {}
    sends: dict[tuple[int, int, str, int], Node] = {}
    recvs: dict[tuple[int, int, str, int], Node] = {}
    lane_prev: dict[tuple[int, int], tuple] = {}  # (rank, index) -> key of the previous op on its lane
    last: dict[tuple, tuple] = {}
    for r, nodes in graph.nodes.items():
        for n in nodes:
            if n.kind is NodeKind.COMPUTE:
                compute[(r, n.index)] = max(0, n.duration_ns)
            elif n.kind is NodeKind.COLLECTIVE:
                members.setdefault((n.group_id, n.seq), []).append(n)
                lane = ("c", r, n.group_id)
                if lane in last:
                    lane_prev[(r, n.index)] = last[lane]
                last[lane] = (n.group_id, n.seq)
            elif n.kind is NodeKind.SEND:
                sends[_message_key(n)] = n
                lane = ("p", r, n.group_id, n.peer)
                if lane in last:
                    lane_prev[(r, n.index)] = last[lane]
                last[lane] = _message_key(n)
            elif n.kind is NodeKind.RECV:
                recvs[_message_key(n)] = n
    coll_end = {k: min((m.end_ns for m in ms if m.end_ns >= 0), default=-1) for k, ms in members.items()}
    collective: dict[tuple[str, int], int] = {}
    for key, ms in members.items():
        known = [m for m in ms if m.duration_ns >= 0 and m.start_ns >= 0]
        if not known:
            collective[key] = 0
            continue
        fallback = min(m.duration_ns for m in known)
        if not shared:
            collective[key] = fallback
            continue
        ready = max(m.start_ns for m in known)
        for m in known:
            prev = lane_prev.get((m.rank, m.index))
            if prev is not None and coll_end.get(prev, -1) >= 0:
                ready = max(ready, coll_end[prev])
        end = max(coll_end[key], ready)
        collective[key] = min(end - ready, fallback)
    message: dict[tuple[int, int, str, int], int] = {}
    for key, s in sends.items():
        rv = recvs.get(key)
        if rv is None or rv.end_ns < 0:
            message[key] = max(0, s.duration_ns)
            continue
        # The transfer happens inside both sides' issue-to-completion windows: never longer than
        # the shorter one (this also keeps a timed vrank's send honest against a real receiver).
        fallback = min(s.duration_ns, rv.duration_ns) if s.duration_ns >= 0 else rv.duration_ns
        if shared and s.start_ns >= 0 and rv.start_ns >= 0:
            ready = max(s.start_ns, rv.start_ns)
            prev = lane_prev.get((s.rank, s.index))
            if prev is not None and prev in recvs and recvs[prev].end_ns >= 0:
                ready = max(ready, recvs[prev].end_ns)
            message[key] = max(0, min(rv.end_ns - ready, fallback))
        else:
            message[key] = max(0, fallback)
    return Work(compute, collective, message)


def balanced_compute(steps: Mapping[int, tuple[Node, ...]], work: Work,
                     peers: Mapping[int, tuple[int, ...]]) -> dict[tuple[int, int], int]:
    """Each compute segment's least duration over the rank's DP peers that ran the same number of
    segments in this step (the j-th segment of each: the same code, on another replica)."""
    ordinal = {r: [n for n in ns if n.kind is NodeKind.COMPUTE] for r, ns in steps.items()}
    out: dict[tuple[int, int], int] = {}
    for r, comps in ordinal.items():
        mates = [p for p in peers.get(r, (r,)) if p in ordinal and len(ordinal[p]) == len(comps)] or [r]
        for j, n in enumerate(comps):
            out[(r, n.index)] = min(work.compute_ns[(p, ordinal[p][j].index)] for p in mates)
    return out


def _consumers(nodes: tuple[Node, ...], gradient_groups: frozenset[str], program: bool) -> dict[int, int | None]:
    """comm index -> index of the compute that needs its result (None: only the step end)."""
    nxt: dict[int, int | None] = {}
    upcoming: int | None = None
    for n in reversed(nodes):  # the first compute at or after each position
        nxt[n.index] = upcoming
        if n.kind is NodeKind.COMPUTE:
            upcoming = n.index
    waited = {n.target: n.index for n in nodes if n.kind is NodeKind.WAIT}
    out: dict[int, int | None] = {}
    for n in nodes:
        if not n.is_comm:
            continue
        if not program:
            if n.kind is NodeKind.SEND or (n.kind is NodeKind.COLLECTIVE and n.op in _GRADIENT_SYNC
                                            and n.group_id in gradient_groups):
                out[n.index] = None
                continue
        if n.is_async:
            out[n.index] = nxt.get(waited[n.index]) if n.index in waited else None
        else:
            out[n.index] = nxt.get(n.index)
    return out


@dataclass
class StepModel:
    """The DAG of one step under one :class:`Variant` (networkx, integer vertices)."""

    dag: nx.DiGraph
    items: list[Item]
    step_end: dict[int, int]
    """rank -> its step-end vertex."""
    lanes: dict[tuple, list[int]]
    """comm lane -> its transfer vertices (a collective is on every member's lane)."""

    def schedule(self, *, lane_bound: bool = False) -> Schedule:
        """The ASAP schedule. With ``lane_bound``, also the bound that comm lanes set when the
        model does not order them: a lane runs one transfer at a time, in any order, so for
        every release time θ, the transfers released at θ or later end no earlier than
        θ + their sum, and the step then needs at least the shortest of their tails."""
        try:
            order = list(nx.topological_sort(self.dag))
        except nx.NetworkXUnfeasible as e:
            cycle = nx.find_cycle(self.dag)
            where = ", ".join(self._label(u) for u, _ in cycle[:6])
            raise GraphError(f"dependency cycle in the step model: {where}") from e
        finish: dict[int, int] = {}
        via: dict[int, int | None] = {}
        for v in order:
            preds = list(self.dag.predecessors(v))
            arg = max(preds, key=finish.__getitem__) if preds else None
            finish[v] = (finish[arg] if arg is not None else 0) + self.items[v].duration_ns
            via[v] = arg
        step = {r: finish[v] for r, v in self.step_end.items()}
        chain: list[Item] = []
        if step:
            v: int | None = self.step_end[max(step, key=lambda r: (step[r], -r))]
            while v is not None:
                chain.append(self.items[v])
                v = via[v]
        bound, lane = (self._lane_bound(order, finish) if lane_bound else (0, ()))
        return Schedule(finish, step, tuple(reversed(chain)), bound, lane)

    def _lane_bound(self, order: list[int], finish: dict[int, int]) -> tuple[int, tuple[Item, ...]]:
        tail: dict[int, int] = {}
        for v in reversed(order):
            tail[v] = max((self.items[s].duration_ns + tail[s] for s in self.dag.successors(v)), default=0)
        best, lane = 0, ()
        for vs in self.lanes.values():
            ranked = sorted(vs, key=lambda v: finish[v] - self.items[v].duration_ns)
            total, shortest = 0, None
            for i in range(len(ranked) - 1, -1, -1):
                v = ranked[i]
                total += self.items[v].duration_ns
                shortest = tail[v] if shortest is None else min(shortest, tail[v])
                bound = finish[v] - self.items[v].duration_ns + total + shortest
                if bound > best:
                    best, lane = bound, tuple(self.items[u] for u in ranked[i:])
        return best, lane

    def _label(self, v: int) -> str:
        it = self.items[v]
        return f"{it.what}@r{it.rank}" + (f"#{it.node.index}" if it.node is not None else "")


def build_step_model(steps: Mapping[int, tuple[Node, ...]], work: Work, variant: Variant, *,
                     peers: Mapping[int, tuple[int, ...]], gradient_groups: frozenset[str]) -> StepModel:
    """The DAG of one step (``steps``: each rank's nodes of it) under ``variant``."""
    dag = nx.DiGraph()
    items: list[Item] = []

    def add(item: Item) -> int:
        items.append(item)
        dag.add_node(len(items) - 1)
        return len(items) - 1

    compute_ns = balanced_compute(steps, work, peers) if variant.balanced else work.compute_ns
    scale = 1 if variant.comm else 0
    instances: dict[tuple[str, int], int] = {}
    messages: dict[tuple[int, int, str, int], int] = {}
    lane_last: dict[tuple, int] = {}
    lanes: dict[tuple, list[int]] = {}
    step_end: dict[int, int] = {}
    for r, nodes in sorted(steps.items()):
        consumers = _consumers(nodes, gradient_groups, variant.program_order)
        needs: dict[int, list[int]] = {}
        host: int | None = None  # program order: where the host is
        comp: int | None = None  # rules: the last compute segment
        done_of: dict[int, int] = {}
        comm_done: list[int] = []
        end_vertex: int | None = None
        for n in nodes:
            if n.kind is NodeKind.COMPUTE:
                v = add(Item("compute", r, n, compute_ns[(r, n.index)]))
                for u in needs.pop(n.index, ()):
                    dag.add_edge(u, v)
                before = host if variant.program_order else comp
                if before is not None:
                    dag.add_edge(before, v)
                host = comp = v
            elif n.is_comm:
                q = add(Item("issue", r, n, 0))
                before = host if variant.program_order else comp
                if before is not None:
                    dag.add_edge(before, q)
                d = add(Item("done", r, n, 0))
                dag.add_edge(q, d)
                if n.kind is NodeKind.COLLECTIVE:
                    key = (n.group_id, n.seq)
                    t = instances.get(key)
                    if t is None:
                        t = instances[key] = add(Item("collective", r, n, scale * work.collective_ns.get(key, 0)))
                    dag.add_edge(q, t)
                    dag.add_edge(t, d)
                    lane = ("c", r, n.group_id)
                else:
                    key = _message_key(n)
                    t = messages.get(key)
                    if t is None:
                        t = messages[key] = add(Item("message", key[0], n, scale * work.message_ns.get(key, 0), peer=key[1]))
                    dag.add_edge(t, d)
                    if n.kind is NodeKind.SEND:
                        dag.add_edge(q, t)
                    lane = ("p", key[0], n.group_id, key[1])
                if n.kind is not NodeKind.RECV:
                    lanes.setdefault(lane, []).append(t)
                if variant.serialize_lanes and n.kind is not NodeKind.RECV:
                    prev = lane_last.get(lane)
                    if prev is not None and prev != t:
                        dag.add_edge(prev, t)
                    lane_last[lane] = t
                done_of[n.index] = d
                comm_done.append(d)
                consumer = consumers.get(n.index)
                if consumer is not None and not variant.program_order:
                    needs.setdefault(consumer, []).append(d)
                if variant.program_order:
                    host = q if n.is_async else d
            elif n.kind is NodeKind.WAIT:
                if variant.program_order:
                    v = add(Item("wait", r, n, 0))
                    if host is not None:
                        dag.add_edge(host, v)
                    if n.target in done_of:
                        dag.add_edge(done_of[n.target], v)
                    host = v
            elif n.kind is NodeKind.MARK and n.mark == "step_end":
                end_vertex = add(Item("step_end", r, n, 0))
        if end_vertex is None:
            end_vertex = add(Item("step_end", r, None, 0))
        last = host if variant.program_order else comp
        if last is not None:
            dag.add_edge(last, end_vertex)
        for d in comm_done:
            dag.add_edge(d, end_vertex)
        for u_list in needs.values():  # consumers outside this step: the step end
            for u in u_list:
                dag.add_edge(u, end_vertex)
        step_end[r] = end_vertex
    return StepModel(dag, items, step_end, lanes)
