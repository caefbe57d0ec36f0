"""Compare the communication sequences of two recordings of the same job, op for op.

A pure function over records: two runs agree on a rank when its comm nodes (collectives, sends,
recvs) appear in the same order with the same signature — kind, op, group members, peer/root,
shapes, dtype, reduce op and all-to-all splits. Group ids are not compared (they are names), the
members are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .records import GroupInfo, Node

__all__ = ["SequenceDiff", "compare_comm_sequences", "match_ratio"]


@dataclass(frozen=True, slots=True)
class SequenceDiff:
    rank: int
    position: int
    """Index among the rank's comm nodes where the sequences first differ."""
    expected: Node | None
    actual: Node | None

    def __str__(self) -> str:
        from .text import format_node

        exp = format_node(self.expected) if self.expected else "<end of sequence>"
        act = format_node(self.actual) if self.actual else "<end of sequence>"
        return f"rank {self.rank}, comm op #{self.position}: expected {exp}\n{' ' * 20}got      {act}"


def _comm(nodes: Sequence[Node]) -> list[Node]:
    return [n for n in nodes if n.is_comm]


def compare_comm_sequences(
    rank: int,
    expected: Sequence[Node],
    expected_groups: dict[str, GroupInfo],
    actual: Sequence[Node],
    actual_groups: dict[str, GroupInfo],
) -> SequenceDiff | None:
    """The first difference between two node lists of one rank, or None if they agree."""
    exp, act = _comm(expected), _comm(actual)
    for i in range(max(len(exp), len(act))):
        e = exp[i] if i < len(exp) else None
        a = act[i] if i < len(act) else None
        if e is None or a is None or e.signature(expected_groups) != a.signature(actual_groups):
            return SequenceDiff(rank, i, e, a)
    return None


def match_ratio(expected: Sequence[Node], expected_groups, actual: Sequence[Node], actual_groups) -> float:
    """Fraction of positions whose signatures agree (1.0 = identical sequences)."""
    exp, act = _comm(expected), _comm(actual)
    total = max(len(exp), len(act))
    if total == 0:
        return 1.0
    same = sum(
        1 for e, a in zip(exp, act, strict=False) if e.signature(expected_groups) == a.signature(actual_groups)
    )
    return same / total
