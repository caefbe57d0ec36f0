"""What one replayer serves: from the graph, every collective and message that involves a sandbox
rank and whose group's vranks this replayer hosts, per channel in issue order.

A *channel* is what runs in order on both sides: the collectives of one group, or the messages
of one (src, dst, group) stream (the ``live`` engine uses the same channels). Ops among sandbox
ranks only, and ops with no sandbox rank, are not the replayer's business.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prism.core.errors import GraphError
from prism.graph.records import Graph, Node, NodeKind
from prism.nccl_patches.vplan import endpoint_plan

__all__ = ["Channel", "plan_channels"]


@dataclass(frozen=True, slots=True)
class Channel:
    group_id: str
    members: tuple[int, ...]
    """Global ranks in group-rank order."""
    nodes: tuple[Node, ...]
    """The ops in issue order, as a sandbox member recorded them."""
    src: int = -1
    dst: int = -1
    """Message streams: global sender and receiver (one of them a sandbox rank)."""

    @property
    def is_p2p(self) -> bool:
        return self.src >= 0

    @property
    def name(self) -> str:
        return f"{self.group_id}:{self.src}->{self.dst}" if self.is_p2p else self.group_id


def plan_channels(graph: Graph, sandbox: Iterable[int], index: int, num_replayers: int,
                  *, steps: int | None = None) -> list[Channel]:
    """The channels replayer ``index`` of ``num_replayers`` serves (ops of steps < ``steps``)."""
    sandbox = frozenset(sandbox)
    missing = sorted(r for r in sandbox if r not in graph.nodes)
    if missing:
        raise GraphError(f"the graph has no nodes for sandbox ranks {missing}")

    def keep(node: Node) -> bool:
        return steps is None or node.step < steps

    def mine(group_id: str) -> bool:
        members = graph.groups[group_id].ranks
        return endpoint_plan(group_id, members, sandbox, num_replayers).replayer == index

    channels = []
    for gid, info in sorted(graph.groups.items()):
        present = [r for r in info.ranks if r in sandbox]
        if not present or len(present) == len(info.ranks) or not mine(gid):
            continue
        nodes = tuple(n for n in graph.nodes[present[0]]
                      if n.kind is NodeKind.COLLECTIVE and n.group_id == gid and keep(n))
        if nodes:
            channels.append(Channel(gid, info.ranks, nodes))
    streams: dict[tuple[str, int, int], list[Node]] = {}
    for s in sorted(sandbox):
        for n in graph.nodes[s]:
            if n.kind not in (NodeKind.SEND, NodeKind.RECV) or n.peer in sandbox or not keep(n):
                continue
            if not mine(n.group_id):
                continue
            src, dst = (s, n.peer) if n.kind is NodeKind.SEND else (n.peer, s)
            streams.setdefault((n.group_id, src, dst), []).append(n)
    for (gid, src, dst), nodes in sorted(streams.items()):
        channels.append(Channel(gid, graph.groups[gid].ranks, tuple(sorted(nodes, key=lambda n: n.seq)), src, dst))
    return channels
