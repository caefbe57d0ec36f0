"""The two kinds of participants of a pruned collective, as pure step machines.

A *party* hosts one or more group ranks and knows the steps of the pruned schedule it takes part
in. For each step it either produces the message it sends (:meth:`Party.outgoing`) or consumes the
message it receives (:meth:`Party.incoming`). A driver (:mod:`prism.nccl_patches.pruned`) runs the
steps in order over a transport; a value sent at step ``t`` depends only on messages of steps
``< t``, so any driver that finishes each step's receives before the next step's sends is
deadlock-free and deterministic.

* :class:`SandboxParty` is one sandbox rank running the real algorithm on its real data. It does
  not know which peers are virtual.
* :class:`NeighborParty` is a set of neighbor vranks hosted by one endpoint (a replayer), sending
  what the real ranks would have sent, from a :class:`RecordedCollective`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Sequence

import torch

from prism.core.errors import PrismError

from .compensation import (
    RecordedCollective,
    RecordedValues,
    add_deviation,
    bits_equal,
    matches_record,
    same_bits,
    deviation,
    finish_deviation,
    merge_deviations,
)
from .reduction import chunk_bounds, combine, finish
from .schedule import Algo, Geometry, Phase, Step, neighbor_vranks, steps_touching, tree_children

__all__ = ["Party", "SandboxParty", "NeighborParty", "recorded_geometry"]


class Party(abc.ABC):
    algo: Algo
    hosted: frozenset[int]
    steps: list[Step]
    dtype: torch.dtype
    device: torch.device

    @abc.abstractmethod
    def outgoing(self, step: Step) -> torch.Tensor: ...

    @abc.abstractmethod
    def incoming(self, step: Step, value: torch.Tensor) -> None: ...

    def recv_buffer(self, step: Step) -> torch.Tensor:
        """Where the message of ``step`` (received by a hosted rank) is received."""
        return torch.empty(step.numel, dtype=self.dtype, device=self.device)

    def in_flight(self) -> None:  # noqa: B027 - a hook: most parties have nothing to do there
        """Work that needs no message: a driver calls it once, after posting the first step's
        messages and before receiving any, so it runs while they are in flight."""


def _offsets(splits: Sequence[int], row_numel: int) -> list[int]:
    out = [0]
    for s in splits:
        out.append(out[-1] + s * row_numel)
    return out


class SandboxParty(Party):
    """One sandbox rank: its real input, its real combine steps.

    ``data`` is the rank's input (all-reduce, reduce-scatter: the whole input; all-gather: its
    piece; broadcast: the root's tensor or, elsewhere, a buffer of the right size; all-to-all: the
    input whose dim 0 is split by ``in_splits``; send/recv: the message or the receive buffer).

    ``out`` (ring all-reduce and all-gather): a flat contiguous tensor of the output's size that the
    result is built in, and that :meth:`output` returns: the finished chunks are received into it,
    as gloo's ring receives into the op's output, rather than gathered and copied at the end. It
    may be ``data`` itself for an all-reduce (in place): a ring folds every chunk of its own input
    before the first finished chunk arrives.
    """

    def __init__(
        self,
        algo: Algo,
        rank: int,
        data: torch.Tensor,
        *,
        group_size: int,
        reduce_op: str = "",
        root: int = 0,
        peer: int = -1,
        premul: float | None = None,
        in_splits: Sequence[int] | None = None,
        out_splits: Sequence[int] | None = None,
        recorded: RecordedCollective | None = None,
        out: torch.Tensor | None = None,
    ) -> None:
        n = group_size
        self.algo, self.rank, self.n, self.op = algo, rank, n, reduce_op
        self.root, self.peer = root, peer
        self.hosted = frozenset({rank})
        self.dtype, self.device = data.dtype, data.device
        flat = data.reshape(-1)
        self.own = flat * premul if reduce_op == "premul_sum" else flat
        self.recorded = recorded
        self._flat = flat
        self._diverged: bool | None = None
        self._acc: dict[int, torch.Tensor] = {}
        self._full: dict[int, torch.Tensor] = {}
        self._blocks: dict[int, torch.Tensor] = {}
        self._tree_acc: torch.Tensor | None = None
        self._final: torch.Tensor | None = None
        numel = flat.numel()
        self.bounds = chunk_bounds(numel, n)
        block_numel = None
        if algo is Algo.DIRECT_ALL_TO_ALL:
            rows = data.shape[0] if data.dim() else 1
            self.row_numel = math.prod(data.shape[1:])
            self.in_splits = tuple(in_splits) if in_splits is not None else (rows // n,) * n
            self.out_splits = tuple(out_splits) if out_splits is not None else self.in_splits
            if sum(self.in_splits) != rows or len(self.in_splits) != n or len(self.out_splits) != n:
                raise PrismError(f"all_to_all: rank {rank}'s splits {self.in_splits} do not cover its {rows} rows")
            self.in_off = _offsets(self.in_splits, self.row_numel)
            self.out_off = _offsets(self.out_splits, self.row_numel)

            def block_numel(src: int, dst: int) -> int:
                return (self.in_splits[dst] if src == rank else self.out_splits[src]) * self.row_numel

        self._out = out if algo in (Algo.RING_ALL_REDUCE, Algo.RING_ALL_GATHER) and n > 1 else None
        if self._out is not None:
            want = numel * (n if algo is Algo.RING_ALL_GATHER else 1)
            assert self._out.dim() == 1 and self._out.numel() == want and self._out.is_contiguous(), \
                f"{algo.value}: output buffer of {self._out.numel()} elements for {want}"
        if algo is Algo.RING_ALL_GATHER:
            self._full[rank] = flat
            if self._out is not None:
                mine = self._out[rank * numel : (rank + 1) * numel]
                if mine.data_ptr() != flat.data_ptr():
                    mine.copy_(flat)
        elif algo is Algo.CHAIN_BROADCAST and rank == root:
            self._full[0] = flat
        geometry = Geometry(n, numel, root, peer, block_numel)
        self.steps = steps_touching(algo, geometry, [rank])

    # ----------------------------------------------------------------------------- steps

    def in_flight(self) -> None:
        # The divergence check compares the whole input with the record (20-150 µs for 512 KiB):
        # here it overlaps the first messages' transfer instead of delaying the first send. It
        # must run before a result lands in an input that is also the output (in place).
        if self._diverged is None:
            rec, flat = self.recorded, self._flat
            self._diverged = rec is not None and self.rank in rec.inputs and (
                not matches_record(flat, rec.inputs[self.rank]) or not same_bits(flat, rec.inputs[self.rank]))

    @property
    def diverged(self) -> bool:
        """The rank's input differs from the recorded one."""
        self.in_flight()
        assert self._diverged is not None
        return self._diverged

    def _chunk(self, t: torch.Tensor, c: int) -> torch.Tensor:
        lo, hi = self.bounds[c]
        return t[lo:hi]

    def _out_chunk(self, c: int) -> torch.Tensor:
        """Chunk ``c`` of the result in ``out`` (all-gather: rank c's piece)."""
        assert self._out is not None
        if self.algo is Algo.RING_ALL_GATHER:
            m = self._out.numel() // self.n
            return self._out[c * m : (c + 1) * m]
        return self._chunk(self._out, c)

    def recv_buffer(self, step: Step) -> torch.Tensor:
        if self._out is not None and step.phase is Phase.GATHER:
            return self._out_chunk(step.chunk)
        return super().recv_buffer(step)

    def outgoing(self, step: Step) -> torch.Tensor:
        c = step.chunk
        if step.phase is Phase.REDUCE:
            return self._acc[c] if c in self._acc else self._chunk(self.own, c)
        if step.phase is Phase.GATHER:
            return self._full[c]
        if step.phase is Phase.UP:
            return self._tree_total()
        if step.phase is Phase.DOWN:
            return self._tree_final()
        if self.algo is Algo.P2P:
            return self.own
        return self.own[self.in_off[step.dst] : self.in_off[step.dst + 1]]

    def incoming(self, step: Step, value: torch.Tensor) -> None:
        c = step.chunk
        if step.phase is Phase.REDUCE:
            acc = combine(value, self._chunk(self.own, c), self.op)
            if step.completes:
                self._full[c] = finish(acc, self.op, self.n)
                if self._out is not None:
                    self._full[c] = self._out_chunk(c).copy_(self._full[c])
            else:
                self._acc[c] = acc
        elif step.phase is Phase.GATHER:
            if self._out is not None:
                slot = self._out_chunk(c)
                value = slot if slot.data_ptr() == value.data_ptr() else slot.copy_(value)  # received elsewhere
            self._full[c] = value
        elif step.phase is Phase.UP:
            self._tree_acc = combine(self._tree_total(), value, self.op)
        elif step.phase is Phase.DOWN:
            self._final = value
        else:
            self._blocks[step.src] = value

    # ---------------------------------------------------------------------------- tree

    def _tree_total(self) -> torch.Tensor:
        if self._tree_acc is None:
            self._tree_acc = self.own.clone()
        return self._tree_acc

    def _tree_final(self) -> torch.Tensor:
        if self._final is None:  # this rank is the root
            assert self.rank == 0, "a tree node below the root gets its final value from its parent"
            total = self._tree_total()
            real = finish(total, self.op, self.n)
            if self.recorded is None:
                self._final = real
            else:
                # The tree reduces in another order than the collector: where the total equals
                # the recorded tree total bit for bit, select the collected value.
                values = RecordedValues(self.recorded)
                same = bits_equal(total, values.tree_partial(0)).to(real.device)
                self._final = torch.where(same, values.full().to(real.device), real)
        return self._final

    # --------------------------------------------------------------------------- result

    def output(self) -> torch.Tensor | None:
        """The rank's flat output (None for the sending side of a send/recv)."""
        a, n, r = self.algo, self.n, self.rank
        if n == 1:
            return finish(self.own.clone(), self.op, 1) if a.reduces else self.own.clone()
        if self._out is not None:
            return self._out
        if a in (Algo.RING_ALL_REDUCE, Algo.RING_ALL_GATHER):  # empty chunks have no steps
            return torch.cat([self._full.get(c, self.own.new_empty(0)) for c in range(n)])
        if a is Algo.RING_REDUCE_SCATTER:
            return self._full.get(r, self.own.new_empty(0))
        if a is Algo.CHAIN_BROADCAST:
            return self._full[0]
        if a is Algo.TREE_ALL_REDUCE:
            return self._tree_final()
        if a is Algo.P2P:
            return self._blocks.get(self.root, self.own.new_empty(0)) if r == self.peer else None
        own_block = self.own[self.in_off[r] : self.in_off[r + 1]]
        empty = self.own.new_empty(0)
        return torch.cat([own_block if i == r else self._blocks.get(i, empty) for i in range(n)])


def recorded_geometry(rec: RecordedCollective) -> Geometry:
    """The geometry a vrank endpoint derives from the recorded data (the sandbox derives the same
    from its own tensors)."""
    a, s0 = rec.algo, rec.sandbox[0]
    block_numel = None
    if a is Algo.DIRECT_ALL_TO_ALL:

        def block_numel(src: int, dst: int) -> int:
            if dst in rec.out_splits:
                return rec.out_splits[dst][src] * rec.row_numel
            return rec.in_splits[src][dst] * rec.row_numel

        numel = 0
    elif a is Algo.P2P:
        message = rec.outputs.get(rec.peer, rec.inputs.get(rec.root))
        numel = 0 if message is None else message.numel()  # 0: no sandbox rank takes part
    elif a is Algo.CHAIN_BROADCAST:
        numel = rec.outputs[s0].numel()
    else:
        numel = rec.inputs[s0].numel()
    return Geometry(rec.group_size, numel, rec.root, rec.peer, block_numel)


class NeighborParty(Party):
    """Neighbor vranks ``hosted`` by one endpoint, answering from recorded data.

    Deviations are shared among the vranks of one endpoint only: host all neighbor vranks of a
    group on one endpoint to carry every sandbox change into every output (docs/pruned-collectives.md).
    """

    def __init__(self, rec: RecordedCollective, hosted: Iterable[int], pruned: Sequence[Step] | None = None) -> None:
        """``pruned`` is ``rec``'s pruned schedule when the caller already has it (it costs O(n) for a ring)."""
        self.rec, self.values = rec, RecordedValues(rec)
        self.algo, self.n, self.op = rec.algo, rec.group_size, rec.reduce_op
        self.hosted = frozenset(hosted)
        if self.hosted & set(rec.sandbox):
            raise PrismError(f"{rec.algo.value}: ranks {sorted(self.hosted & set(rec.sandbox))} are sandbox ranks, not vranks")
        some = next(iter([*rec.outputs.values(), *rec.inputs.values()]), torch.empty(0))
        self.dtype, self.device = some.dtype, some.device
        if pruned is None:
            pruned = steps_touching(rec.algo, recorded_geometry(rec), rec.sandbox)
        self.steps = [st for st in pruned if st.src in self.hosted or st.dst in self.hosted]
        self.needed = neighbor_vranks(pruned, rec.sandbox)
        self._dev: dict[int, torch.Tensor | None] = {}  # ring: chunk -> latest deviation seen
        self._seen_full: dict[int, torch.Tensor] = {}  # chunk -> a real value a sandbox forwarded
        self._tree_dev: dict[int, torch.Tensor | None] = {}  # sandbox node -> deviation of its subtree
        # The recorded partials the steps send or compare with are derived now, before the vranks are
        # due (the replayer builds the party ahead): on the step itself the derivation would sit
        # between a sandbox message's arrival and the vrank's answer to it.
        for st in self.steps:
            if st.phase is Phase.REDUCE:
                self.values.ring_partial(st.src, st.chunk)
            elif st.phase is Phase.UP:
                self.values.tree_partial(st.src)

    # ----------------------------------------------------------------------------- send

    def outgoing(self, step: Step) -> torch.Tensor:
        a, c, v = self.algo, step.chunk, self.values
        if step.phase is Phase.REDUCE:
            return add_deviation(v.ring_partial(step.src, c), self._dev.get(c), self.op)
        if step.phase is Phase.GATHER:
            if c in self._seen_full:
                return self._seen_full[c]
            if a is Algo.CHAIN_BROADCAST:
                return v.full()
            if a is Algo.RING_ALL_GATHER:
                m = self.rec.inputs[self.rec.sandbox[0]].numel()
                return v.full()[c * m : (c + 1) * m]
            full_c = v.chunk(v.full(), c)
            if c in v.sandbox:  # a sandbox owner's value that this endpoint did not see
                return full_c
            return add_deviation(full_c, finish_deviation(self._dev.get(c), self.op, self.n), self.op)
        if step.phase is Phase.UP:
            return add_deviation(v.tree_partial(step.src), self._subtree_dev(step.src), self.op)
        if step.phase is Phase.DOWN:
            if 0 in self._seen_full:
                return self._seen_full[0]
            root_dev = None if 0 in v.sandbox else self._subtree_dev(0)
            return add_deviation(v.full(), finish_deviation(root_dev, self.op, self.n), self.op)
        # EXCHANGE: the block the sandbox rank received from this vrank in the collected run
        if a is Algo.P2P:
            return self.rec.outputs[step.dst]
        off = _offsets(self.rec.out_splits[step.dst], self.rec.row_numel)
        return self.rec.outputs[step.dst][off[step.src] : off[step.src + 1]]

    # -------------------------------------------------------------------------- receive

    def incoming(self, step: Step, value: torch.Tensor) -> None:
        c, v = step.chunk, self.values
        if step.phase is Phase.REDUCE:
            self._dev[c] = deviation(value, v.ring_partial(step.src, c), self.op)
        elif step.phase in (Phase.GATHER, Phase.DOWN):
            self._seen_full[c] = value
        elif step.phase is Phase.UP:
            self._tree_dev[step.src] = deviation(value, v.tree_partial(step.src), self.op)
        # EXCHANGE: the sandbox's data is consumed (a real peer would use it; vranks do not)

    def _subtree_dev(self, u: int) -> torch.Tensor | None:
        """Deviation of node u's subtree total from the recorded one, as far as this endpoint saw:
        a sandbox node's observed deviation (which includes everything below it), else the sum
        over the children."""
        if u in self.values.sandbox:
            return self._tree_dev.get(u)
        return merge_deviations([self._subtree_dev(c) for c in tree_children(u, self.n)], self.op)
