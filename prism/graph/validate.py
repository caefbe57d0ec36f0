"""Consistency checks of a PrismTrace graph: a pure function from a graph to its violations.

What must hold (each failure is one :class:`Violation` naming the rank, node and op):

* structure: ``nodes[r][i]`` has rank r and index i; comm nodes name a known group that has the
  rank as a member; P2P peers are group members other than the rank itself;
* collectives: every instance ``(group_id, seq)`` is issued exactly once by every member of the
  group, and the members agree on op, dtype, reduce op, root and shapes (per op: equal inputs for
  all_reduce/broadcast/reduce/barrier/reduce_scatter, all_gather outputs that hold every member's
  input, all_to_all splits where what rank i sends to j is what j expects from i);
* each rank issues a group's collectives in increasing seq order (and each pair's messages too);
* point to point: every SEND ``(src, dst, group, seq)`` has exactly one RECV with equal size_bytes;
* WAIT: its target is an earlier comm node of the same rank.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from prism.core.errors import GraphError
from prism.graph.records import CommOp, Graph, Node, NodeKind
from prism.graph.text import format_node

__all__ = ["Violation", "validate", "check"]

log = logging.getLogger(__name__)

_MAX_REPORTED = 20

_EQUAL_INPUTS = frozenset({CommOp.ALL_REDUCE, CommOp.BROADCAST, CommOp.REDUCE, CommOp.BARRIER})
_EQUAL_OUTPUTS = frozenset({CommOp.ALL_REDUCE, CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER})
_ROOTED = frozenset({CommOp.BROADCAST, CommOp.REDUCE, CommOp.GATHER, CommOp.SCATTER})


@dataclass(frozen=True, slots=True)
class Violation:
    rank: int
    index: int
    """Index of the offending node in the rank's list (-1 when the problem is a missing node)."""
    node: str
    """The offending (or, for a missing node, a representative) node in its one-line form."""
    message: str

    def __str__(self) -> str:
        where = f"r{self.rank}#{self.index}" if self.index >= 0 else f"r{self.rank}"
        return f"{where}: {self.message} [{self.node}]"


def _v(node: Node, message: str, *, rank: int | None = None) -> Violation:
    if rank is not None and rank != node.rank:
        return Violation(rank, -1, format_node(node), message)
    return Violation(node.rank, node.index, format_node(node), message)


def validate(graph: Graph) -> list[Violation]:
    """Every inconsistency of ``graph``, in rank/index order within each rule."""
    out: list[Violation] = []
    instances: dict[tuple[str, int], list[Node]] = defaultdict(list)
    sends: dict[tuple[int, int, str, int], list[Node]] = defaultdict(list)
    recvs: dict[tuple[int, int, str, int], list[Node]] = defaultdict(list)

    for rank in sorted(graph.nodes):
        last_seq: dict[tuple, int] = {}
        nodes = graph.nodes[rank]
        for i, n in enumerate(nodes):
            if n.rank != rank or n.index != i:
                out.append(_v(n, f"stored as rank {rank} position {i} but says r{n.rank}#{n.index}"))
            if n.kind is NodeKind.WAIT:
                if not 0 <= n.target < i:
                    out.append(_v(n, f"WAIT target #{n.target} is not an earlier node of rank {rank}"))
                elif not nodes[n.target].is_comm:
                    what = nodes[n.target].kind.value
                    out.append(_v(n, f"WAIT target #{n.target} is a {what}, not a comm node"))
                continue
            if not n.is_comm:
                continue
            group = graph.groups.get(n.group_id)
            if group is None:
                out.append(_v(n, f"unknown group {n.group_id!r}"))
                continue
            if rank not in group.ranks:
                out.append(_v(n, f"rank {rank} is not a member of group {n.group_id!r} {list(group.ranks)}"))
                continue
            if n.kind is NodeKind.COLLECTIVE:
                order_key: tuple = (n.group_id,)
                instances[(n.group_id, n.seq)].append(n)
            else:
                if n.peer not in group.ranks or n.peer == rank:
                    out.append(_v(n, f"peer {n.peer} is not another member of group {n.group_id!r}"))
                    continue
                src, dst = (rank, n.peer) if n.kind is NodeKind.SEND else (n.peer, rank)
                order_key = (n.group_id, n.kind, n.peer)
                (sends if n.kind is NodeKind.SEND else recvs)[(src, dst, n.group_id, n.seq)].append(n)
            prev = last_seq.get(order_key)
            if prev is not None and n.seq <= prev:
                out.append(_v(n, f"seq {n.seq} issued after seq {prev} on group {n.group_id!r}"))
            last_seq[order_key] = n.seq

    for (gid, seq), members in instances.items():
        out += _check_instance(graph, gid, seq, members)
    for key in sorted(sends.keys() | recvs.keys()):
        out += _check_message(key, sends.get(key, []), recvs.get(key, []))
    return out


def _check_instance(graph: Graph, gid: str, seq: int, members: list[Node]) -> list[Violation]:
    group = graph.groups[gid]
    out: list[Violation] = []
    where = f"g{gid}:{seq}"
    by_rank: dict[int, Node] = {}
    for n in members:
        if n.rank in by_rank:
            out.append(_v(n, f"issues collective {where} twice (also #{by_rank[n.rank].index})"))
        else:
            by_rank[n.rank] = n
    ref = by_rank[min(by_rank)]
    for r in group.ranks:
        if r not in by_rank:
            out.append(
                _v(ref, f"never issues collective {where} {_op(ref)} that ranks {sorted(by_rank)} issue", rank=r)
            )
    if len(by_rank) < len(group.ranks):
        return out  # shapes are compared only between complete instances

    def differs(what: str, get) -> None:  # noqa: ANN001
        want = get(ref)
        for n in by_rank.values():
            if get(n) != want:
                mine = get(n)
                out.append(_v(n, f"{what} {mine!r} differs from r{ref.rank}#{ref.index}'s {want!r} in {where}"))

    differs("op", lambda n: _op(n))
    if out:
        return out
    differs("dtype", lambda n: n.dtype)
    differs("reduce op", lambda n: n.reduce_op)
    if ref.op in _ROOTED:
        differs("root", lambda n: n.peer)
    if ref.op in _EQUAL_INPUTS:
        differs("shapes", lambda n: n.shapes)
        differs("size_bytes", lambda n: n.size_bytes)
    if ref.op in _EQUAL_OUTPUTS:
        differs("out_shapes", lambda n: n.out_shapes)
    if ref.op is CommOp.REDUCE_SCATTER:
        differs("shapes", lambda n: n.shapes)
    if ref.op is CommOp.ALL_GATHER:
        out += _check_all_gather(group.ranks, by_rank, gid, seq)
    if ref.op is CommOp.ALL_TO_ALL:
        out += _check_all_to_all(group.ranks, by_rank, gid, seq)
    return out


def _op(n: Node) -> str:
    return n.op.value if n.op is not None else "?"


def _check_all_gather(
    ranks: tuple[int, ...], by_rank: dict[int, Node], gid: str, seq: int
) -> list[Violation]:
    """List outputs hold one entry per member: member j's input must match entry j."""
    out = []
    for n in by_rank.values():
        if len(n.out_shapes) != len(ranks) or len(n.out_shapes) < 2:
            continue
        for j, r in enumerate(ranks):
            sent = by_rank[r].shapes[:1]
            if sent and sent[0] != n.out_shapes[j]:
                got, given = list(n.out_shapes[j]), list(sent[0])
                out.append(_v(n, f"all_gather output {j} {got} but rank {r} contributes {given} in g{gid}:{seq}"))
    if not out and any(len(n.out_shapes) < 2 for n in by_rank.values()):
        ref = by_rank[ranks[0]]
        for n in by_rank.values():
            if n.shapes != ref.shapes:
                other = f"r{ref.rank}#{ref.index}'s {ref.shapes!r}"
                out.append(_v(n, f"shapes {n.shapes!r} differ from {other} in g{gid}:{seq}"))
    return out


def _rows(splits: tuple[int, ...], shapes: tuple[tuple[int, ...], ...], size: int) -> list[int] | None:
    """Rows exchanged with each member: explicit splits, the list form, or an even split."""
    if splits:
        return list(splits)
    if len(shapes) == size and size > 1:
        return [s[0] if s else 0 for s in shapes]
    if shapes and shapes[0]:
        return [shapes[0][0] // size] * size
    return None


def _check_all_to_all(
    ranks: tuple[int, ...], by_rank: dict[int, Node], gid: str, seq: int
) -> list[Violation]:
    """Rank i's in_splits[j] (rows sent to j) must equal rank j's out_splits[i] (rows from i)."""
    size = len(ranks)
    out = []
    sent: dict[int, list[int] | None] = {}
    got: dict[int, list[int] | None] = {}
    for r in ranks:
        n = by_rank[r]
        sent[r] = _rows(n.in_splits, n.shapes, size)
        got[r] = _rows(n.out_splits, n.out_shapes or n.shapes, size)
        for name, rows in (("in_splits", sent[r]), ("out_splits", got[r])):
            if rows is not None and len(rows) != size:
                msg = f"all_to_all {name} has {len(rows)} entries for a group of {size} in g{gid}:{seq}"
                out.append(_v(n, msg))
    if out:
        return out
    for i, ri in enumerate(ranks):
        for j, rj in enumerate(ranks):
            s, g = sent[ri], got[rj]
            if s is None or g is None or s[j] == g[i]:
                continue
            msg = f"all_to_all sends {s[j]} rows to rank {rj}, which expects {g[i]} from rank {ri} in g{gid}:{seq}"
            out.append(_v(by_rank[ri], msg))
    return out


def _check_message(key: tuple[int, int, str, int], sends: list[Node], recvs: list[Node]) -> list[Violation]:
    src, dst, gid, seq = key
    name = f"message r{src}->r{dst} g{gid}:{seq}"
    out = []
    if not recvs:
        return [_v(s, f"{name} is never received by rank {dst}") for s in sends]
    if not sends:
        return [_v(r, f"{name} is never sent by rank {src}") for r in recvs]
    for extra in sends[1:] + recvs[1:]:
        out.append(_v(extra, f"{name} appears more than once"))
    send, recv = sends[0], recvs[0]
    if send.size_bytes != recv.size_bytes:
        sender = f"r{send.rank}#{send.index}"
        out.append(_v(recv, f"{name}: receives {recv.size_bytes} bytes but {sender} sends {send.size_bytes}"))
    return out


def check(graph: Graph) -> None:
    """Raise GraphError listing the violations of ``graph`` (the first 20 and a count)."""
    violations = validate(graph)
    if not violations:
        return
    lines = [str(v) for v in violations[:_MAX_REPORTED]]
    if len(violations) > _MAX_REPORTED:
        lines.append(f"... and {len(violations) - _MAX_REPORTED} more")
    raise GraphError(f"graph has {len(violations)} violation(s):\n  " + "\n  ".join(lines))
