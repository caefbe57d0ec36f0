"""A networkx view of a PrismTrace graph, for analysis and tests (wraps networkx, no subclass).

Node ids:

* ``(rank, index)`` for every record, with attributes ``node`` (the :class:`Node`), ``kind``,
  ``op``, ``duration_ns`` and ``label`` (the one-line print form);
* ``("instance", group_id, seq)`` for each collective instance (a virtual node: the moment all
  members have issued it), with ``kind="instance"``, ``op`` and ``members``.

Edges point forward in time, each with a ``kind`` attribute:

* ``program``: ``(r, i) -> (r, i + 1)``;
* ``wait``: the awaited comm node ``(r, target) -> (r, i)`` of a WAIT;
* ``issue``: each member's collective node ``-> instance``;
* ``complete``: ``instance ->`` the node that consumes the completion on each member: the next
  node for a synchronous collective, the WAITs targeting it for an asynchronous one;
* ``p2p``: a SEND ``-> `` its RECV.

A graph whose ranks agree on their collectives gives a DAG (``nx.is_directed_acyclic_graph``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from prism.graph.records import Graph, NodeKind
from prism.graph.text import format_node

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["to_networkx", "instance_id"]


def instance_id(group_id: str, seq: int) -> tuple[str, str, int]:
    """The networkx node id of collective instance ``(group_id, seq)``."""
    return ("instance", group_id, seq)


def to_networkx(graph: Graph) -> nx.DiGraph:
    import networkx as nx  # here: every worker imports prism.graph, few build this view (0.15 s)

    g = nx.DiGraph()
    sends: dict[tuple[int, int, str, int], tuple[int, int]] = {}
    recvs: dict[tuple[int, int, str, int], tuple[int, int]] = {}
    waiters: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rank in sorted(graph.nodes):
        nodes = graph.nodes[rank]
        for n in nodes:
            g.add_node(
                (rank, n.index),
                node=n,
                kind=n.kind.value,
                op=n.op.value if n.op else "",
                duration_ns=n.duration_ns,
                label=format_node(n),
            )
            if n.index > 0:
                g.add_edge((rank, n.index - 1), (rank, n.index), kind="program")
            if n.kind is NodeKind.WAIT and 0 <= n.target < len(nodes):
                g.add_edge((rank, n.target), (rank, n.index), kind="wait")
                waiters[(rank, n.target)].append(n.index)
            elif n.kind is NodeKind.SEND:
                sends[(rank, n.peer, n.group_id, n.seq)] = (rank, n.index)
            elif n.kind is NodeKind.RECV:
                recvs[(n.peer, rank, n.group_id, n.seq)] = (rank, n.index)

    for rank in sorted(graph.nodes):
        nodes = graph.nodes[rank]
        for n in nodes:
            if n.kind is not NodeKind.COLLECTIVE:
                continue
            inst = instance_id(n.group_id, n.seq)
            if inst not in g:
                members = graph.groups[n.group_id].ranks if n.group_id in graph.groups else ()
                g.add_node(inst, kind="instance", op=n.op.value if n.op else "", members=members)
            g.add_edge((rank, n.index), inst, kind="issue")
            if n.is_async:
                consumers = waiters.get((rank, n.index), [])
            else:
                consumers = [n.index + 1] if n.index + 1 < len(nodes) else []
            for j in consumers:
                g.add_edge(inst, (rank, j), kind="complete")

    for key, send in sends.items():
        recv = recvs.get(key)
        if recv is not None:
            g.add_edge(send, recv, kind="p2p")
    return g
