"""Iteration boundaries of a rank that never marked one: the period of its comm sequence.

A training step issues the same communication ops in the same order every iteration, so a rank
that has no ``optimizer.step`` and no ``prism.mark_step()`` (a hand-written pipeline, a forward-only
job) still has steps: the repetitions of its op sequence. :func:`find_period` finds them in a
sequence of op signatures; :func:`infer_step_marks` applies that to a rank's node list and returns
it with ``step_end`` MARK nodes where the steps end, exactly as if the script had called
``prism.mark_step()`` there. The recorder applies it when a rank finishes without a mark, so every
role (record, collect, calibrate, emulate, validate) sees the same boundaries for the same op
sequence.

The rule (pure, deterministic):

* The sequence is the rank's comm nodes and WAITs, in program order. Each comm node is reduced to
  its :func:`period_signature` (kind, op, group, peer, shapes, dtype, reduce op; an all-to-all's
  shapes and the splits are left out because they follow the data), each WAIT to ``WAIT`` and its
  target's signature. Waits tell apart steps whose comm ops alone look like their microbatches (the
  last stage of a pipeline receives an activation and sends a gradient per microbatch, and waits
  for its sends once per step).
* The **run** is the longest stretch of the sequence made of ``count >= 2`` whole repetitions of
  one block; among runs of the longest coverage (``count * period`` elements) the smallest period
  wins, then the earliest start. Ops before the run (a prologue: warmup ops, the shape exchange of
  ``torch.distributed.pipelining`` at step 0) belong to step 0; ops after it (an epilogue: a final
  barrier, a partial step) to no measured step.
* The run must cover at least half of the sequence (:data:`MIN_COVERAGE`); otherwise no period is
  found and the rank has no steps (say so and name the fix: :data:`NO_STEPS_FIX`).
* Step ``k`` ends when repetition ``k`` is done: a ``step_end`` MARK right after its last element,
  at the time the rank moved on (the issue time of the node after it). The compute before a
  step's first comm op thus belongs to the step before, a phase shift that leaves every steady
  step one period long; step 0 also holds what came before the run (start-up, prologue), and the
  last repetition is a whole step.

Search: candidate periods come from the prefix function (KMP failure function) of the sequence
read from eight evenly spaced anchors (a run that covers half of the sequence holds one anchor in
its first eighth of the sequence, and repeats for 1.5 periods after it), plus every period up to
half the length when the sequence is short (``EXHAUSTIVE_UP_TO``); each candidate is scored exactly
with one vectorised comparison of the sequence with itself shifted by the period.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from prism.graph.records import CommOp, Node, NodeKind

__all__ = [
    "Period",
    "StepInference",
    "find_period",
    "period_signature",
    "infer_step_marks",
    "step_times_from_marks",
    "MIN_COVERAGE",
    "NO_STEPS_FIX",
    "no_steps_message",
]

MIN_COVERAGE = 0.5
"""The run must cover at least this fraction of a rank's sequence (comm ops and waits)."""
EXHAUSTIVE_UP_TO = 1024
"""Sequences up to this length also try every period up to half their length."""
_ANCHORS = 8
"""Prefix functions start at j n / 8: a run covering half of the sequence has one of them within its
first n / 8 ops, from where it repeats for at least 1.5 periods (its period is at least n / 4 k)."""
NO_STEPS_FIX = "set iterations.boundary in the job file (docs/job-file.md) or call prism.mark_step() at the end of each step"


def no_steps_message(ranks: Sequence[int]) -> str:
    """The one line every command prints when ranks have no iteration boundary."""
    which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return (f"no iteration boundary found for {which} (no optimizer.step, no prism.mark_step(), and the comm "
            f"sequence does not repeat): {NO_STEPS_FIX}")


@dataclass(frozen=True, slots=True)
class Period:
    """``count`` whole repetitions of a block of ``length`` elements starting at ``start``."""

    start: int
    length: int
    count: int

    @property
    def end(self) -> int:
        """One past the last element of the last whole repetition."""
        return self.start + self.length * self.count

    @property
    def coverage(self) -> int:
        return self.length * self.count


def _encode(seq: Sequence[Hashable]) -> np.ndarray:
    ids: dict[Hashable, int] = {}
    return np.fromiter((ids.setdefault(x, len(ids)) for x in seq), dtype=np.int64, count=len(seq))


def _score(a: np.ndarray, p: int) -> Period | None:
    """The run of period ``p`` with the most whole repetitions (earliest on ties)."""
    eq = a[p:] == a[:-p]
    if not eq.any():
        return None
    edges = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    counts = (np.flatnonzero(edges == -1) - starts + p) // p
    i = int(np.argmax(counts))
    return Period(int(starts[i]), p, int(counts[i]))


def _prefix_periods(seq: Sequence[int]) -> set[int]:
    """Smallest periods ``p`` of the prefixes of ``seq`` that hold for at least 1.5 ``p`` elements
    (prefix function)."""
    n = len(seq)
    pi = [0] * n
    found = set()
    k = 0
    for i in range(1, n):
        x = seq[i]
        while k and seq[k] != x:
            k = pi[k - 1]
        if seq[k] == x:
            k += 1
        pi[i] = k
        if 3 * k >= i + 1:  # 2 (i + 1) >= 3 p
            found.add(i + 1 - k)
    return found


def _candidates(a: np.ndarray) -> set[int]:
    n = len(a)
    half = n // 2
    seq = a.tolist()
    found: set[int] = set()
    for j in range(_ANCHORS):
        found |= _prefix_periods(seq[j * n // _ANCHORS:])
    if n <= EXHAUSTIVE_UP_TO:
        found |= set(range(1, half + 1))
    return {p for p in found if 1 <= p <= half}


def find_period(seq: Sequence[Hashable]) -> Period | None:
    """The run of whole repetitions that covers the most of ``seq`` (module docstring), or None
    when no run of at least two repetitions covers :data:`MIN_COVERAGE` of it."""
    n = len(seq)
    if n < 2:
        return None
    a = _encode(seq)
    best: Period | None = None
    for p in sorted(_candidates(a)):
        got = _score(a, p)
        if got is None or got.count < 2:
            continue
        if best is None or (-got.coverage, got.length, got.start) < (-best.coverage, best.length, best.start):
            best = got
    if best is None:
        return None
    # The smallest period of the run divides any period of it that repeats at least twice.
    for d in range(1, best.length):
        if best.length % d == 0:
            got = _score(a, d)
            if got is not None and got.coverage >= best.coverage:
                best = got
                break
    if best.coverage < MIN_COVERAGE * n:
        return None
    return best


def period_signature(node: Node) -> tuple:
    """What identifies a comm op within one rank's sequence, for finding its period."""
    data_dependent = node.op is CommOp.ALL_TO_ALL
    return (node.kind, node.op, node.group_id, node.peer, () if data_dependent else node.shapes, node.dtype,
            node.reduce_op)


@dataclass(frozen=True, slots=True)
class StepInference:
    """A rank's node list with the inferred ``step_end`` MARKs, and how they were found."""

    nodes: tuple[Node, ...]
    period: Period | None
    """In comm-op positions; None: no period (``nodes`` unchanged)."""
    num_comm_ops: int
    """Length of the sequence the period was searched in (comm ops and waits)."""
    mark_positions: tuple[int, ...] = ()
    """Where the MARKs went, as positions in the input list (a MARK precedes the node there)."""

    def step_of(self, position: int) -> int:
        """The step that an event at ``position`` of the input list (before that node) belongs to."""
        return bisect.bisect_right(self.mark_positions, position)

    @property
    def num_steps(self) -> int:
        return sum(1 for n in self.nodes if n.kind is NodeKind.MARK and n.mark == "step_end")


def _mark_positions(at: list[int], period: Period) -> list[int]:
    """Node positions before which a step_end MARK goes: right after each repetition's last element."""
    return [at[period.start + k * period.length - 1] + 1 for k in range(1, period.count + 1)]


def _moved_on_ns(nodes: Sequence[Node], j: int) -> int:
    """When the rank moved on to node ``j``: its issue time (past the end: the last node's end)."""
    if j < len(nodes):
        return nodes[j].start_ns
    last = nodes[j - 1]
    return last.end_ns if last.end_ns >= 0 else last.start_ns


def _sequence(nodes: Sequence[Node]) -> tuple[list[int], list[tuple]]:
    """Positions and signatures of the rank's comm nodes and waits (a wait: its target's signature)."""
    at, sigs = [], []
    for i, n in enumerate(nodes):
        if n.is_comm:
            at.append(i)
            sigs.append(period_signature(n))
        elif n.kind is NodeKind.WAIT and 0 <= n.target < i and nodes[n.target].is_comm:
            at.append(i)
            sigs.append((NodeKind.WAIT, *period_signature(nodes[n.target])))
    return at, sigs


def infer_step_marks(nodes: Sequence[Node]) -> StepInference:
    """``nodes`` (one rank, program order, no step_end MARK) with a step_end MARK after every
    repetition of its sequence of comm ops and waits (module docstring). Node indices, WAIT targets
    and ``step`` fields are renumbered."""
    comm_at, sigs = _sequence(nodes)
    period = find_period(sigs)
    if period is None:
        return StepInference(tuple(nodes), None, len(comm_at))
    positions = _mark_positions(comm_at, period)
    marks_before = [0] * (len(nodes) + 1)  # marks_before[i]: marks inserted before old node i
    for j in positions:
        marks_before[j] += 1
    for i in range(1, len(marks_before)):
        marks_before[i] += marks_before[i - 1]
    rank = nodes[0].rank
    out: list[Node] = []
    queued = iter(positions)
    nxt = next(queued, None)
    for i in range(len(nodes) + 1):
        while nxt == i:
            out.append(Node(rank=rank, index=len(out), kind=NodeKind.MARK, mark="step_end",
                            step=marks_before[i] - 1, start_ns=_moved_on_ns(nodes, i)))
            nxt = next(queued, None)
        if i == len(nodes):
            break
        n = nodes[i]
        changes: dict = {"index": len(out), "step": marks_before[i]}
        if n.kind is NodeKind.WAIT and 0 <= n.target < len(nodes):
            changes["target"] = n.target + marks_before[n.target]
        out.append(dataclasses.replace(n, **changes))
    return StepInference(tuple(out), period, len(comm_at), tuple(positions))


def step_times_from_marks(nodes: Sequence[Node], begin_ns: int) -> tuple[int, ...]:
    """Step k: its step_end MARK's time minus the previous one's (step 0: minus ``begin_ns``, when
    the rank started), the definition the recorder uses for marks the script makes."""
    ends = [n.start_ns for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end"]
    return tuple(b - a for a, b in zip([begin_ns, *ends[:-1]], ends, strict=True))
