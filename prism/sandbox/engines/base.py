"""The comm-engine interface: who decides a communication op's outputs and completion.

The sandbox's ``"prism"`` process group turns every call of the script into a
:class:`CommRequest` and hands it to the active engine. An engine writes the outputs (now or
later) and completes the returned future; the process group never blocks on its own.
DDP waits on that future and never calls ``Work.wait()`` (notes/torch-facts.md), so an engine
must complete futures by itself: immediately, or from its own thread.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field

import torch

from prism.graph.records import CommOp

__all__ = ["GroupHandle", "CommRequest", "CommEngine", "ENGINE_NAMES", "DONE_NS", "complete_op", "stamp_done"]

DONE_NS = "done_ns"
"""``CommRequest.extra`` key: ``time.perf_counter_ns()`` when the engine completed the op's future."""


def stamp_done(extra: dict) -> None:
    """Stamp now as the op's completion (``extra[DONE_NS]``), just before its future completes.
    The observer learns of the completion in a done-callback, which runs after ``set_result`` has
    woken the script and needs the GIL: when the script runs Python right after waking (DDP's
    optimizer step after the C++ wait on its bucket all-reduces), the callback runs up to that long
    later, and an op's duration read there would include it (docs/emulate.md, "A completion stamped
    late")."""
    extra[DONE_NS] = time.perf_counter_ns()


def complete_op(future: torch.futures.Future, value, extra: dict) -> None:
    """Complete ``future`` with ``value``, stamped first (:func:`stamp_done`)."""
    stamp_done(extra)
    future.set_result(value)


ENGINE_NAMES = ("passthrough", "fake", "torch-fake", "coordinator", "live", "recorded")


@dataclass(frozen=True, slots=True)
class GroupHandle:
    """A logical process group as this rank sees it."""

    group_id: str
    """c10d's group name: the same string on every rank for the same group."""
    ranks: tuple[int, ...]
    """Global ranks of the members in group-rank order."""
    group_rank: int
    desc: str = ""
    _positions: dict[int, int] | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    """Global rank -> group rank, built at the first lookup. ``ranks.index`` scans the tuple: ~25 µs in
    a group of 4,096 ranks on the 2-core host, twice per message on the script's thread of a sandbox rank."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def global_rank(self) -> int:
        return self.ranks[self.group_rank]

    def to_group_rank(self, global_rank: int) -> int:
        positions = self._positions
        if positions is None:
            positions = {r: i for i, r in enumerate(self.ranks)}
            object.__setattr__(self, "_positions", positions)
        try:
            return positions[global_rank]
        except KeyError:
            raise ValueError(f"rank {global_rank} is not a member of group {self.group_id} "
                             f"({len(self.ranks)} ranks)") from None


@dataclass(slots=True)
class CommRequest:
    """One communication op as the script issued it, in logical terms.

    ``inputs`` and ``outputs`` are the script's own tensors; for in-place ops (all_reduce,
    broadcast) they are the same objects. ``root``/``peer`` are *global* ranks.
    """

    op: CommOp
    group: GroupHandle
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    reduce_op: str = ""
    root: int = -1
    peer: int = -1
    tag: int = 0
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    flat: bool = False
    """ALL_GATHER/REDUCE_SCATTER: one flat tensor instead of a list per rank (``*_into_tensor``)."""
    coalesced: bool = False
    """Several independent tensors in one call (``*_coalesced``): inputs[i] pairs with outputs[i]."""
    seq: int = -1
    """Filled by the process group: collective sequence in the group, or per-pair P2P sequence."""
    extra: dict = field(default_factory=dict)


class CommEngine(abc.ABC):
    """Decides values and completion of every comm op of one rank."""

    name: str = ""

    def create_group(self, group: GroupHandle, store: object) -> None:  # noqa: B027
        """Called once for each group this rank belongs to, in creation order."""

    @abc.abstractmethod
    def submit(self, request: CommRequest) -> torch.futures.Future:
        """Start the op; the future completes (value: ``request.outputs``) when outputs are final."""

    def shutdown(self) -> None:  # noqa: B027
        """Release resources; called once when the rank's program ends."""
