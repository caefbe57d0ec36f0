"""PrismTrace records: the immutable in-memory form of an execution graph.

A graph holds, per logical rank, an ordered list of :class:`Node`. Identities are stable across
ranks so that cross-rank synchronisation is implied by matching them:

* a collective instance is ``(group_id, seq)``: the seq-th collective issued on that group;
* a point-to-point message is ``(src, dst, group_id, pair_seq)``: the pair_seq-th message from
  global rank ``src`` to global rank ``dst`` on that group.

Times are nanoseconds relative to the rank's own start (``start_ns``) and durations are
``duration_ns``; both are -1 when unknown (a bare graph collected without trustworthy timing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "NodeKind",
    "CommOp",
    "Node",
    "GroupInfo",
    "RankSummary",
    "Graph",
    "TemplateMap",
    "RankRecord",
    "merge_groups",
    "COMM_KINDS",
]


class NodeKind(enum.Enum):
    COMPUTE = "COMPUTE"
    COLLECTIVE = "COLLECTIVE"
    SEND = "SEND"
    RECV = "RECV"
    WAIT = "WAIT"
    MARK = "MARK"


COMM_KINDS = frozenset({NodeKind.COLLECTIVE, NodeKind.SEND, NodeKind.RECV})


class CommOp(enum.Enum):
    """Logical communication operations (what the script asked for, not how it was executed)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"  # list outputs or a single flat output (all_gather_into_tensor)
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    BARRIER = "barrier"
    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class Node:
    """One event of one rank. Only the fields that matter for its kind are set."""

    rank: int
    index: int
    """Position in the rank's node list (program order)."""
    kind: NodeKind
    op: CommOp | None = None
    group_id: str = ""
    """Group name as c10d assigned it (identical on every rank); members are in Graph.groups."""
    seq: int = -1
    """COLLECTIVE: sequence number in the group. SEND/RECV: per (src, dst, group) sequence."""
    peer: int = -1
    """SEND/RECV: global rank of the other side. BROADCAST/REDUCE/GATHER/SCATTER: global root."""
    tag: int = 0
    size_bytes: int = 0
    """Bytes this rank contributes (inputs); for RECV the bytes received."""
    dtype: str = ""
    """Short dtype name: f32, bf16, f16, f64, i64, i32, i8, u8, bool."""
    shapes: tuple[tuple[int, ...], ...] = ()
    """Shapes of the input tensors (one entry per tensor; empty for barrier)."""
    out_shapes: tuple[tuple[int, ...], ...] = ()
    """Shapes of the output tensors when they differ from the inputs' (all_gather, all_to_all)."""
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    """ALL_TO_ALL: split sizes along dim 0 (empty means even)."""
    reduce_op: str = ""
    """sum, avg, product, min, max, band, bor, bxor, premul_sum; empty when not a reduction."""
    is_async: bool = False
    call_site: str = ""
    """``file.py:line`` of the first frame outside torch and prism."""
    target: int = -1
    """WAIT: index (in this rank's list) of the comm node waited for."""
    mark: str = ""
    """MARK: ``step_begin`` or ``step_end``."""
    step: int = -1
    """The iteration this node belongs to (-1 before the first step boundary)."""
    start_ns: int = -1
    duration_ns: int = -1
    payload: str = ""
    """Content hash of the recorded output payload (RUN/payloads/<hash>.safetensors), if any."""

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def end_ns(self) -> int:
        return -1 if self.start_ns < 0 or self.duration_ns < 0 else self.start_ns + self.duration_ns

    def signature(self, groups: dict[str, GroupInfo]) -> tuple:
        """What must agree between a real run and any other run of the same job.

        (kind, op, group members, peer, shapes, out_shapes, dtype, reduce op, splits)
        """
        members = groups[self.group_id].ranks if self.group_id in groups else ()
        return (
            self.kind.value,
            self.op.value if self.op else "",
            members,
            self.peer,
            self.shapes,
            self.out_shapes,
            self.dtype,
            self.reduce_op,
            self.in_splits,
            self.out_splits,
        )


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group_id: str
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    desc: str = ""
    """c10d's group description (e.g. ``mesh_tp``), for humans."""


@dataclass(frozen=True, slots=True)
class RankSummary:
    """Per-rank measurements that are not nodes."""

    rank: int
    losses: tuple[float, ...] = ()
    """Loss per step (sum of the scalar roots of backward in that step, or prism.report)."""
    step_times_ns: tuple[int, ...] = ()
    """Wall time of each step, step_begin to step_end."""
    peak_memory_bytes: int = -1
    """Peak over the whole run (-1: unknown)."""
    memory_source: str = ""
    """How the peaks were measured: ``cuda.max_memory_allocated``, ``cpu.tracked_storage_peak``
    or ``cpu.peak_rss``."""
    exit_code: int = 0
    measured_peak_memory_bytes: int = -1
    """Peak over the measured steps: from the end of the job's ``iterations.warmup`` steps to the
    end of its ``iterations.measured`` steps (-1: unknown)."""


@dataclass(frozen=True, slots=True)
class TemplateMap:
    """DP templates (DESIGN §5): rank r runs template rank ``template_of[r]``'s program, renamed.

    Replica d renames ranks with the permutation ``rank_maps[d]`` (``rank_maps[d][x]`` plays x's
    role in replica d) and groups with ``group_maps[d]`` (template group id -> its group id).
    Replica 0 is the one that ran: identity maps. :func:`prism.graph.templates.expand` applies it.
    """

    template_of: tuple[int, ...]
    replica_of: tuple[int, ...]
    rank_maps: tuple[tuple[int, ...], ...]
    group_maps: tuple[dict[str, str], ...]
    kind: str = "dp"

    @property
    def num_replicas(self) -> int:
        return len(self.rank_maps)

    @property
    def template_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, t in enumerate(self.template_of) if r == t)


@dataclass(frozen=True, slots=True)
class Graph:
    """A whole execution graph. ``nodes[r]`` is rank r's node list.

    With ``templates`` set, ``nodes`` holds only the template ranks (the on-disk form of a DP-templated
    collection); ``prism.graph.io.read_graph`` returns it expanded (every rank, ``templates`` None).
    """

    world_size: int
    nodes: dict[int, tuple[Node, ...]]
    groups: dict[str, GroupInfo]
    summaries: dict[int, RankSummary] = field(default_factory=dict)
    kind: str = "real"
    """real (recorded from a real run), bare (collected), timed (calibrated)."""
    job_name: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    templates: TemplateMap | None = None

    def comm_nodes(self, rank: int) -> list[Node]:
        return [n for n in self.nodes[rank] if n.is_comm]


@dataclass(slots=True)
class RankRecord:
    """What one rank's worker hands back (pickled to ``rank-R.pkl``): its nodes, the groups it
    belongs to and its summary. Every role that starts workers reads it; it lives here so that
    none of them imports another."""

    rank: int
    world_size: int
    nodes: list[Node]
    groups: list[GroupInfo]
    summary: RankSummary
    engine: str
    clock_origin_ns: int = 0
    other_groups: list[GroupInfo] = field(default_factory=list)
    """Groups created while this rank was not a member (c10d names them on every rank): what DP
    templates need to rename a template's groups into another replica's."""


def merge_groups(records) -> dict[str, GroupInfo]:
    """The groups of several ranks' records (every rank names the same ids); a description seen
    on any rank is kept."""
    groups: dict[str, GroupInfo] = {}
    for rec in records:
        for g in rec.groups:
            known = groups.get(g.group_id)
            if known is None or (not known.desc and g.desc):
                groups[g.group_id] = g
    return groups
