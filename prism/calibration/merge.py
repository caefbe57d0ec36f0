"""Put the times measured in timing slices onto the bare graph.

A rank that ran for real in a slice recorded its own node list (same comm sequence as the bare
graph, by construction of the shim). Its compute spans are aligned with the bare graph's by
*segment*: the compute between two consecutive non-compute nodes (comm, WAIT, MARK). A bare
segment takes the measured segment's total duration (spread over its compute nodes in proportion
to their bare durations, or on the first one). Comm nodes take the measured duration, which in a
slice is close to the pure transfer time because virtual peers answer as soon as they can.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from prism.core.errors import GraphError
from prism.graph.records import Graph, Node, NodeKind
from prism.graph.text import format_node

__all__ = ["apply_measurements", "segments"]


def segments(nodes: Sequence[Node]) -> tuple[list[list[int]], list[int]]:
    """(compute node indices per segment, indices of the non-compute nodes that close them).

    Segment k holds the COMPUTE nodes between non-compute node k-1 and k; there is one more
    segment than boundaries (the tail after the last boundary).
    """
    groups: list[list[int]] = [[]]
    boundaries: list[int] = []
    for i, n in enumerate(nodes):
        if n.kind is NodeKind.COMPUTE:
            groups[-1].append(i)
        else:
            boundaries.append(i)
            groups.append([])
    return groups, boundaries


def _check_same_sequence(rank: int, bare: Sequence[Node], measured: Sequence[Node], bare_b, meas_b) -> None:
    if len(bare_b) != len(meas_b):
        raise GraphError(
            f"rank {rank}: the timing slice recorded {len(meas_b)} comm/wait/mark nodes but the bare graph has "
            f"{len(bare_b)}; the script did not follow the collected path"
        )
    for bi, mi in zip(bare_b, meas_b, strict=True):
        b, m = bare[bi], measured[mi]
        if (b.kind, b.op, b.group_id, b.seq, b.mark) != (m.kind, m.op, m.group_id, m.seq, m.mark):
            raise GraphError(f"rank {rank}: slice node {format_node(m)} does not match bare node {format_node(b)}")


def _rank_with_measurements(rank: int, bare: Sequence[Node], measured: Sequence[Node]) -> tuple[Node, ...]:
    bare_groups, bare_b = segments(bare)
    meas_groups, meas_b = segments(measured)
    _check_same_sequence(rank, bare, measured, bare_b, meas_b)
    out = list(bare)
    for bare_seg, meas_seg in zip(bare_groups, meas_groups, strict=True):
        total = sum(max(0, measured[i].duration_ns) for i in meas_seg)
        if not bare_seg:
            continue
        weights = [max(0, bare[i].duration_ns) for i in bare_seg]
        wsum = sum(weights)
        shares = [w / wsum for w in weights] if wsum > 0 else [1.0] + [0.0] * (len(bare_seg) - 1)
        assigned = 0
        for k, i in enumerate(bare_seg):
            d = total - assigned if k == len(bare_seg) - 1 else int(total * shares[k])
            assigned += d
            out[i] = dataclasses.replace(bare[i], duration_ns=d)
    for bi, mi in zip(bare_b, meas_b, strict=True):
        if bare[bi].kind is not NodeKind.MARK:
            out[bi] = dataclasses.replace(bare[bi], duration_ns=measured[mi].duration_ns, start_ns=measured[mi].start_ns)
    return tuple(out)


def apply_measurements(
    bare: Graph,
    measured: Mapping[int, Sequence[Node]],
    template_of: Mapping[int, int] | None = None,
) -> Graph:
    """The bare graph with measured durations; ranks without their own measurement take those of
    a measured rank of the same template. Every rank must end up measured."""
    nodes = dict(bare.nodes)
    by_template: dict[int, int] = {}
    for rank, rank_nodes in measured.items():
        nodes[rank] = _rank_with_measurements(rank, bare.nodes[rank], rank_nodes)
        if template_of:
            by_template.setdefault(template_of.get(rank, rank), rank)
    missing = []
    for rank in bare.nodes:
        if rank in measured:
            continue
        source = by_template.get(template_of.get(rank, rank)) if template_of else None
        if source is None:
            missing.append(rank)
            continue
        nodes[rank] = _rank_with_measurements(rank, bare.nodes[rank], measured[source])
    if missing:
        raise GraphError(f"ranks without a timing measurement: {missing}")
    return dataclasses.replace(bare, nodes=nodes, meta={**bare.meta, "clock": "per-rank"})
