"""The discrete-event pass of :mod:`.simulate`, run online over the virtual ranks of an emulation.

:func:`~.simulate.simulate` predicts every rank of a graph from calibrated durations alone.
During an emulation the sandbox ranks run for real, possibly a *changed* program, so the ops a
vrank shares with them complete when they really do. :class:`LiveSim` walks the vranks of a timed
graph with the same rules (compute lane, per-group collective lanes, P2P eager or a rendezvous as
the graph's meta says, waits, step-end settling) and treats every op with a sandbox member as
**external**: it is issued at the vrank's simulated time and completes at the real time the
replayer reports. A vrank blocked on an external op stays blocked until the report arrives;
everything that depends on it through any chain of vrank-to-vrank ops then moves with it, and
vranks that do not depend on it keep their calibrated pace. Compute durations and vrank-to-vrank
transfer times are the timed graph's.

Times are on the real clock (``perf_counter_ns``). Each vrank starts at 0 — long ago — and its
compute before its first comm op counts nothing: until its first external completion a vrank
answers at once (the first op of a job is a barrier or collective that every rank reaches after
start-up). Pure: the caller feeds reports and reads issue times; nothing here sleeps or locks.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable

from prism.core.errors import GraphError
from prism.graph.records import Graph, Node, NodeKind
from prism.graph.simulate import _Sim

__all__ = ["LiveSim", "op_key"]

OpKey = tuple


def op_key(node: Node) -> OpKey:
    """The identity every participant of an op shares: ``(group, seq)`` for a collective,
    ``(group, src, dst, seq)`` for a message."""
    if node.kind is NodeKind.COLLECTIVE:
        return (node.group_id, node.seq)
    if node.kind is NodeKind.SEND:
        return (node.group_id, node.rank, node.peer, node.seq)
    if node.kind is NodeKind.RECV:
        return (node.group_id, node.peer, node.rank, node.seq)
    raise GraphError(f"r{node.rank}#{node.index}: {node.kind.value} is not a comm op")


def _from_first_comm(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """The rank's nodes with the compute before its first comm op taking no time (start-up)."""
    out = list(nodes)
    for i, n in enumerate(nodes):
        if n.is_comm:
            break
        if n.kind is NodeKind.COMPUTE:
            out[i] = dataclasses.replace(n, duration_ns=0)
    return tuple(out)


class LiveSim(_Sim):
    """Online simulation of the vranks of ``timed`` (module docstring).

    ``served``: the external ops whose completion the caller will report (None: all of them).
    An external op that is not served (another replayer plays it) completes after the duration
    the timed graph predicted for it, counted from the vrank's simulated issue.
    """

    def __init__(self, timed: Graph, sandbox: Iterable[int], *, served: Iterable[OpKey] | None = None) -> None:
        self.sandbox = frozenset(sandbox)
        vranks = {r: _from_first_comm(ns) for r, ns in timed.nodes.items() if r not in self.sandbox}
        super().__init__(dataclasses.replace(timed, nodes=vranks))
        self.served = frozenset(served) if served is not None else None
        self._external_groups = {gid for gid, g in timed.groups.items() if self.sandbox & set(g.ranks)}
        self.index_of: dict[tuple[int, OpKey], int] = {}
        for r, ns in vranks.items():
            for n in ns:
                if n.is_comm:
                    self.index_of[(r, op_key(n))] = n.index
        self._arrivals: dict[OpKey, dict[int, int]] = {}  # external collective -> vrank -> issue
        self._pending: dict[OpKey, list[tuple[int, int]]] = {}  # external op -> vrank nodes issued, not done
        self._reported: dict[tuple[int, OpKey], int] = {}
        self._first_report: dict[OpKey, int] = {}
        self._hosted: set[tuple[int, OpKey]] = set()
        self._vrank_members: dict[str, tuple[int, ...]] = {
            gid: tuple(r for r in g.ranks if r not in self.sandbox) for gid, g in timed.groups.items()}
        heapq.heapify(self.heap)
        self._drain()

    # ------------------------------------------------------------------------------ external ops

    def is_external(self, n: Node) -> bool:
        if n.kind is NodeKind.COLLECTIVE:
            return n.group_id in self._external_groups
        return n.peer in self.sandbox

    def _arrive(self, n: Node, t: int) -> None:
        if n.group_id in self._external_groups:
            self._arrivals.setdefault(op_key(n), {})[n.rank] = t
            self._external(n, t)
        else:
            super()._arrive(n, t)

    def _send(self, n: Node, t: int) -> None:
        self._external(n, t) if n.peer in self.sandbox else super()._send(n, t)

    def _recv(self, n: Node, t: int) -> None:
        self._external(n, t) if n.peer in self.sandbox else super()._recv(n, t)

    def _external(self, n: Node, t: int) -> None:
        key = op_key(n)
        if self.served is not None and key not in self.served:
            self._complete(n.rank, n.index, t, t + max(0, n.duration_ns))
            return
        done = self._done_at(n.rank, key)
        if done is None:
            self._pending.setdefault(key, []).append((n.rank, n.index))
        else:
            self._complete(n.rank, n.index, t, max(t, done))

    def _done_at(self, rank: int, key: OpKey) -> int | None:
        """The real completion of ``rank``'s part of external op ``key``: its own report, or for a
        vrank no replayer thread plays (pruned from the collective) the op's first report."""
        own = self._reported.get((rank, key))
        if own is not None or (rank, key) in self._hosted:
            return own
        return self._first_report.get(key)

    # ------------------------------------------------------------------------------ the caller

    def announce(self, rank: int, key: OpKey) -> None:
        """``rank``'s part of ``key`` is played (and will be reported) by the replayer."""
        self._hosted.add((rank, key))

    def report(self, rank: int, key: OpKey, real_ns: int) -> None:
        """``rank``'s part of external op ``key`` completed for real at ``real_ns``; advance."""
        self._reported.setdefault((rank, key), real_ns)
        self._first_report.setdefault(key, real_ns)
        pending = self._pending.get(key)
        if pending:
            still = []
            for r, i in pending:
                done = self._done_at(r, key)
                if done is None:
                    still.append((r, i))
                else:
                    issued = self.issue[r][i]
                    self._complete(r, i, issued, max(issued, done))
            if still:
                self._pending[key] = still
            else:
                del self._pending[key]
        self._drain()

    def issue_ns(self, rank: int, key: OpKey) -> int | None:
        """When vrank ``rank`` issues its part of ``key`` (None: not known yet). A collective's
        part is issued once every vrank member has arrived: in the real ring, data from the pruned
        vranks passes through the hosted neighbors."""
        try:
            i = self.index_of[(rank, key)]
        except KeyError:
            raise GraphError(f"vrank {rank}: the timed graph has no op {key}; calibrate this run again") from None
        t = self.issue[rank][i]
        if t < 0:
            return None
        if len(key) == 2:
            arrivals = self._arrivals.get(key, {})
            members = self._vrank_members[key[0]]
            if len(arrivals) < len(members):
                return None
            return max(arrivals.values())
        return t

    def _drain(self) -> None:
        heap = self.heap
        while heap:
            _, r = heapq.heappop(heap)
            self._advance(r)
