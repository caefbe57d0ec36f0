"""Put the times measured in timing slices onto the bare graph.

A rank that ran for real in a slice recorded its own node list (same comm sequence as the bare
graph, by construction of the shim). Its compute spans are aligned with the bare graph's by
*segment*: the compute between two consecutive non-compute nodes (comm, WAIT, MARK). A bare
segment takes the measured segment's total duration (spread over its compute nodes in proportion
to their bare durations, or on the first one). Comm nodes take the measured duration, which in a
slice is close to the pure transfer time because virtual peers answer as soon as they can.

A slice measures each step once, on a host that other work shares: :func:`typical_steps` gives
every node of the steady steps its median over those steps (the steps run the same program), so
a burst of load during one step of one slice does not become a slow step in the prediction; a
slice measured more than once gives each node its median over the takes (:func:`median_of_takes`).
Not the shortest take: the real run's spans carry the host's jitter too, and each node's own
minimum over three takes made hybrid-sleep's calibrated step 5–6 % short on 16 cores against
2–3 % with the median (session 33).

Warm-up steps are different: the first op on a group in a slice also pays one-time setup (the
``live`` engine connects a group's transport on first use; a real run connects at group
creation). :func:`settle_warmup` gives those ops their steady-state duration, so that a one-time
cost of one slice does not shift its ranks' phase in the pipeline at the start of the measured
steps.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from prism.core.errors import GraphError
from prism.graph.records import Graph, Node, NodeKind
from prism.graph.text import format_node

__all__ = ["apply_measurements", "median_of_takes", "merge_slice", "segments", "settle_warmup", "typical_steps",
           "typical_takes"]


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


def _signature(n: Node) -> tuple:
    return (n.kind, n.op, n.group_id, n.peer, n.size_bytes)


def settle_warmup(graph: Graph, skip_steps: int) -> Graph:
    """The graph with each comm node of steps ``< skip_steps`` taking the median duration of the
    same op (kind, op, group, peer, bytes) on the same rank in the later steps; ops with no later
    counterpart (the start-up barrier) keep theirs."""
    if skip_steps <= 0:
        return graph
    nodes = dict(graph.nodes)
    for rank, rank_nodes in graph.nodes.items():
        steady: dict[tuple, list[int]] = {}
        for n in rank_nodes:
            if n.is_comm and n.step >= skip_steps and n.duration_ns >= 0:
                steady.setdefault(_signature(n), []).append(n.duration_ns)
        medians = {k: int(statistics.median(v)) for k, v in steady.items()}
        nodes[rank] = tuple(
            dataclasses.replace(n, duration_ns=medians[_signature(n)])
            if n.is_comm and n.step < skip_steps and _signature(n) in medians else n
            for n in rank_nodes
        )
    return dataclasses.replace(graph, nodes=nodes)


def typical_steps(nodes: Sequence[Node], skip_steps: int) -> tuple[Node, ...]:
    """A rank's measured nodes with each node of the complete steps ``>= skip_steps`` taking the
    median duration of the nodes at its position in those steps. Unchanged when those steps do
    not all have the same node sequence (kind, op, group, peer, bytes), or when there are fewer
    than three of them."""
    done = {n.step for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end"}
    by_step: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.step >= skip_steps and n.step in done:
            by_step.setdefault(n.step, []).append(i)
    steps = list(by_step.values())
    if len(steps) < 3 or len({tuple(_signature(nodes[i]) for i in idx) for idx in steps}) != 1:
        return tuple(nodes)
    out = list(nodes)
    for position in zip(*steps, strict=True):
        median = int(statistics.median(nodes[i].duration_ns for i in position))
        for i in position:
            out[i] = dataclasses.replace(nodes[i], duration_ns=median)
    return tuple(out)


def median_of_takes(takes: Sequence[Sequence[Node]]) -> tuple[Node, ...]:
    """Several measurements of one rank (the same program): each node with its median duration
    over the takes. Takes whose node sequence differs from the first one's are left out."""
    same = _same_program(takes)
    return tuple(dataclasses.replace(n, duration_ns=int(statistics.median(t[i].duration_ns for t in same)))
                 for i, n in enumerate(takes[0]))


def _same_program(takes: Sequence[Sequence[Node]]) -> list[Sequence[Node]]:
    """The takes whose node sequence is the first one's (the first among them)."""
    shape = [_signature(n) for n in takes[0]]
    return [t for t in takes if [_signature(n) for n in t] == shape]


MERGES = ("median", "rotated")
"""How a rank's calibration takes become its measured nodes (:func:`merge_takes`)."""

DEFAULT_MERGE = "rotated"
"""The merge ``prism calibrate`` uses unless told: each step keeps its measured spans, so the timed
graph keeps the step-to-step jitter a real run's collectives wait on (docs/emulate.md, session 41)."""

TAKE_TOLERANCE = 0.03
"""How far a slice's take may lie from its median take (its measured steps' summed spans) and still
be rotated in (:func:`typical_takes`)."""


def rotated_takes(takes: Sequence[Sequence[Node]], skip_steps: int) -> tuple[Node, ...]:
    """Several measurements of one rank, kept step by step: take 0's nodes, each node of step
    s >= ``skip_steps`` timed by take (s − skip_steps) mod k. Every step keeps the spans one take
    measured for it, so a collective waits for whichever rank was slow that step, as in a real run;
    medians keep only the typically-last one. Takes whose node sequence differs from the first
    one's are left out."""
    same = _same_program(takes)
    return tuple(dataclasses.replace(n, duration_ns=same[(n.step - skip_steps) % len(same)][i].duration_ns)
                 if n.step >= skip_steps else n for i, n in enumerate(takes[0]))


def typical_takes(slice_takes: Mapping[int, Sequence[Sequence[Node]]], skip_steps: int) -> list[int]:
    """The takes of one slice (each of its ranks' takes, in take order) whose measured steps lie
    within :data:`TAKE_TOLERANCE` of the median take's: the slice's ranks' spans in the steps
    ``>= skip_steps``, summed. A take the host slowed as a whole (tp-sleep on 16 cores, session 43:
    one take +8.8 %, the others +0.8 / +1.7 %) would give a third of the rotated graph's steps;
    a slow *step* stays, as the rotation means it to. All takes when fewer than three, or when
    none but the median lies near it."""
    num = min(len(t) for t in slice_takes.values())
    if num < 3:
        return list(range(num))
    totals = [sum(max(n.duration_ns, 0) for takes in slice_takes.values() for n in takes[k] if n.step >= skip_steps)
              for k in range(num)]
    middle = statistics.median(totals)
    kept = [k for k, t in enumerate(totals) if middle and abs(t / middle - 1) <= TAKE_TOLERANCE]
    return kept if len(kept) >= 2 else list(range(num))


def merge_slice(slice_takes: Mapping[int, Sequence[Sequence[Node]]], skip_steps: int,
                merge: str = DEFAULT_MERGE) -> dict[int, tuple[Node, ...]]:
    """Each rank of one slice: its measured nodes from its takes (:func:`merge_takes`); ``rotated``
    over the slice's typical takes only (:func:`typical_takes`), the same ones for every rank."""
    if merge == "rotated":
        kept = typical_takes(slice_takes, skip_steps)
        slice_takes = {r: [takes[k] for k in kept] for r, takes in slice_takes.items()}
    return {r: merge_takes(takes, skip_steps, merge) for r, takes in slice_takes.items()}


def merge_takes(takes: Sequence[Sequence[Node]], skip_steps: int, merge: str = DEFAULT_MERGE) -> tuple[Node, ...]:
    """One rank's measured nodes from its takes: ``median``, each node of the steady steps its
    median over the steps (:func:`typical_steps`), then over the takes (:func:`median_of_takes`);
    ``rotated``, each step from one take (:func:`rotated_takes`)."""
    if merge == "median":
        return median_of_takes([typical_steps(t, skip_steps) for t in takes])
    if merge == "rotated":
        return rotated_takes(takes, skip_steps)
    raise ValueError(f"unknown merge of calibration takes {merge!r}: one of {', '.join(MERGES)}")
