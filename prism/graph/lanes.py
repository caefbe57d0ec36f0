"""Lanes of a rank's timeline: the compute stream and one lane per comm stream.

A comm stream is what runs a rank's ops one after the other: a group's collectives, the messages
to one peer, the messages from one peer (NCCL's per-communicator and per-peer streams; gloo's
helper threads in the passthrough engine). A comm node's span on its lane starts when it was
issued or, if the lane was still busy, when the op before it ended, and ends at its completion:
spans on one lane never overlap, so a trace viewer nests them correctly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .records import Node, NodeKind

__all__ = ["COMPUTE_LANE", "Span", "lane_of", "lane_spans"]

COMPUTE_LANE = "compute"


@dataclass(frozen=True, slots=True)
class Span:
    lane: str
    node: Node
    start_ns: int
    end_ns: int


def lane_of(n: Node) -> str:
    if n.kind is NodeKind.COLLECTIVE:
        return f"g{n.group_id}"
    if n.kind is NodeKind.SEND:
        return f"g{n.group_id} send→r{n.peer}"
    if n.kind is NodeKind.RECV:
        return f"g{n.group_id} recv←r{n.peer}"
    return COMPUTE_LANE


def lane_spans(nodes: Iterable[Node], times: Iterable[tuple[int, int]] | None = None) -> Iterator[Span]:
    """Spans of a rank's timed nodes (MARKs and nodes without times are left out). ``times``:
    (start, end) per node instead of the nodes' own."""
    busy: dict[str, int] = {}
    pairs = times if times is not None else ((n.start_ns, n.end_ns) for n in nodes)
    for n, (start, end) in zip(nodes, pairs):
        if n.kind is NodeKind.MARK or start < 0 or end < 0:
            continue
        lane = lane_of(n)
        start = max(start, busy.get(lane, start))
        end = max(end, start)
        busy[lane] = end
        yield Span(lane, n, start, end)
