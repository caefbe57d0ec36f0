"""What a neighbor vrank sends, from recorded data; and what the collector must record for it.

Exactness (docs/pruned-collectives.md has the full argument):

* **Exact-order prefixes.** A vrank that feeds a reduce step into a sandbox block sends the
  *recorded partial* the real predecessor would have sent: the fold, in prism's ring order and in
  the tensor's dtype, of every rank from the chunk's start up to that predecessor. The collector
  computes it from all ranks' inputs (:func:`record_for_sandbox`). The sandbox block then folds its
  own inputs exactly as the collector did, so for unchanged inputs the result is the collected one
  bit for bit, and for changed inputs it is the real ring's result for those inputs.
* **Tree.** A vrank child of a sandbox node sends its recorded subtree partial (tree order), so a
  sandbox root rebuilds the recorded tree-order total ``A_rec`` bit for bit; because the collector
  reduces in ring order, the root then *selects*, element by element: where its total equals
  ``A_rec`` bitwise it outputs the collected value, elsewhere the value it really computed.
* **Deviations.** For ops with an inverse (sum, avg, premul_sum: ``-``; bxor: ``^``) a vrank that
  receives a partial ``U`` from a sandbox rank, where the recorded one was ``T``, keeps the
  deviation ``U - T`` (exactly zero where ``U`` and ``T`` are bitwise equal) and adds it to what
  it later sends on the same chunk: the next block's entry prefix, or the full value of a chunk
  it owns. So every output element is ``recorded + Δ`` of the sandbox changes this endpoint saw,
  and exactly ``recorded`` where nothing changed. min/max/product/band/bor have no inverse:
  a sandbox owner's chunk is ``op(recorded prefix, actual inputs of its block)``, and chunks
  owned by vranks stay as recorded.
"""

from __future__ import annotations

import ctypes
import math

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from prism.core.errors import PrismError
from prism.graph.records import CommOp

from .reduction import REDUCE_OPS, chunk_bounds, combine, finish, ring_order
from .schedule import Algo, ring_blocks, tree_children, tree_fold_order

__all__ = [
    "DEVIATION_OPS",
    "RecordedCollective",
    "RecordedValues",
    "record_for_sandbox",
    "algo_for",
    "bits_equal",
    "same_bits",
    "matches_record",
    "describe",
    "recorded_on_another_path",
    "deviation",
    "add_deviation",
    "merge_deviations",
    "finish_deviation",
    "tree_partials",
    "tree_reduce",
]

DEVIATION_OPS = frozenset({"sum", "avg", "premul_sum", "bxor"})
"""Reduce ops whose changed-input result is ``recorded + Δ`` on every output element."""

_BIT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def algo_for(op: CommOp, *, tree: bool = False) -> Algo:
    """The algorithm prism runs for a logical op (``tree`` only changes all-reduce)."""
    table = {
        CommOp.ALL_REDUCE: Algo.TREE_ALL_REDUCE if tree else Algo.RING_ALL_REDUCE,
        CommOp.REDUCE_SCATTER: Algo.RING_REDUCE_SCATTER,
        CommOp.ALL_GATHER: Algo.RING_ALL_GATHER,
        CommOp.BROADCAST: Algo.CHAIN_BROADCAST,
        CommOp.ALL_TO_ALL: Algo.DIRECT_ALL_TO_ALL,
        CommOp.SEND: Algo.P2P,
        CommOp.RECV: Algo.P2P,
    }
    if op not in table:
        raise PrismError(f"{op.value}: no pruned algorithm (supported: {', '.join(o.value for o in table)})")
    return table[op]


# ------------------------------------------------------------------------- deviation algebra


def _as_bits(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` on ``b``'s device, floats viewed as integers of their width, so that ``==``
    compares bits; an error naming both when they differ in size or dtype."""
    if a.numel() != b.numel() or a.dtype != b.dtype:
        raise PrismError(f"the value is {_describe(a)} but the recorded one is {_describe(b)}")
    if a.device != b.device:  # a call saved on the host, where both are (same_bits' hot path)
        a = a.to(b.device)
    view = _BIT_VIEW.get(a.dtype)
    return (a.view(view), b.view(view)) if view is not None else (a, b)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bitwise equality (NaN equals the same NaN; -0.0 differs from 0.0). Recorded
    values ``b`` live on the host, a sandbox rank's ``a`` may be on its device: compare on the host,
    since a device copy of the record (or the result) would count in the rank's allocator peak."""
    a, b = _as_bits(a, b)
    return a == b


_NUMPY_FROM_BYTES = 32 * 1024
"""From this size on the host compares through NumPy (512 KiB: ~13 µs against torch.equal's ~27);
below it torch.equal is the faster one and takes fewer calls (16 KiB: ~2 µs against ~2.7)."""


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` equals ``b`` bit for bit everywhere (``bits_equal(a, b).all()``), as one
    comparison of memory, never an elementwise mask and its reduction (512 KiB: ~140 µs). A sandbox
    rank's divergence check of each send and a vrank's deviation of each received chunk run it on
    the op's critical path, where the torch calls it makes count more than the comparison: on
    pp_sleep_noopt (2 cores, session 37) a send's whole check, the record's lookup included, took a
    median 75-102 µs of thread CPU per rank with the earlier dozen calls (~6 µs in a loop: a rank
    woken from a sleep runs them cold), 36-60 µs with these. Below ``_NUMPY_FROM_BYTES`` two plain
    tensors in host memory are compared as bytes, with no torch op at all (:func:`_same_host_bytes`)."""
    if (equal := _same_host_bytes(a, b)) is not None:
        return equal
    a, b = _as_bits(a, b)
    if a.shape != b.shape:
        a, b = a.reshape(-1), b.reshape(-1)
    if a.device.type == "cpu" and a.numel() * a.element_size() >= _NUMPY_FROM_BYTES:
        try:  # a message may require grad; NumPy refuses those
            return bool(np.array_equal(a.detach().numpy(), b.detach().numpy()))
        except TypeError:  # a dtype NumPy has no type for (e.g. uint16 in older NumPy, complex32)
            pass
    return torch.equal(a, b)


def _same_host_bytes(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two small tensors in host memory hold the same bytes (:func:`host_bytes`: no
    dispatcher call; a send's whole divergence check, the record's lookup included, pp-sleep at W=4
    on 2 cores, session 38: 96–132 µs per message with three torch calls in the tracked memory
    pass, whose dispatch mode sees each one, 25–44 µs with none; 36–45 against 24–44 µs in the
    timed emulation); None when that does not answer it: another size or dtype, or either one not
    readable as its bytes."""
    if a.dtype is not b.dtype or a.numel() != b.numel() or (mine := host_bytes(a)) is None:
        return None
    theirs = host_bytes(b)
    return None if theirs is None else mine == theirs


def host_bytes(t: torch.Tensor) -> bytes | None:
    """A copy of a small tensor's bytes (below ``_NUMPY_FROM_BYTES``) in host memory, read through
    its data pointer with no torch call, e.g. for a comparison made later (:func:`same_bits_as`);
    None for another device, a layout whose memory is not its values (strided, lazily conjugated
    or negated), or no storage (a fake tensor)."""
    try:
        if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg():
            return None
        n = t.numel() * t.element_size()
        return ctypes.string_at(t.data_ptr(), n) if n < _NUMPY_FROM_BYTES else None
    except RuntimeError:  # no storage to point at
        return None


def same_bits_as(data: bytes, dtype: torch.dtype, numel: int, recorded: torch.Tensor) -> bool:
    """Whether ``data`` (:func:`host_bytes` of a tensor of ``dtype`` and ``numel``) equals
    ``recorded`` bit for bit; False where their sizes or dtypes differ."""
    if recorded.dtype is not dtype or recorded.numel() != numel:
        return False
    if (theirs := host_bytes(recorded)) is not None:
        return theirs == data
    return same_bits(torch.frombuffer(bytearray(data), dtype=dtype, count=numel), recorded)


def _describe(t: torch.Tensor) -> str:
    return describe(t.dtype, t.numel())


def describe(dtype: torch.dtype, numel: int) -> str:
    """``float32[16384]``: how errors name a flat tensor's type and size."""
    return f"{str(dtype).removeprefix('torch.')}[{numel}]"


def recorded_on_another_path(what: str, script: str, recorded: str) -> str:
    """The problem when an op's recorded input has another size or dtype than the script's
    (``script``, ``recorded``: as :func:`describe` gives them)."""
    return (f"{what}: the script's input is {script} but the recorded data has {recorded} for it (the run "
            "that recorded it took another path: a checkpoint it resumed from, other arguments or data)")


def matches_record(value: torch.Tensor, recorded: torch.Tensor) -> bool:
    """Whether a recorded value can stand for ``value`` at all: as many elements, of the same dtype."""
    return value.numel() == recorded.numel() and value.dtype == recorded.dtype


def deviation(actual: torch.Tensor, recorded: torch.Tensor, op: str) -> torch.Tensor | None:
    """``actual - recorded`` (``^`` for bxor), exactly zero where they are bitwise equal; None when
    they are equal everywhere or ``op`` has no inverse."""
    if op not in DEVIATION_OPS or same_bits(actual, recorded):
        return None
    same = bits_equal(actual, recorded)
    d = actual ^ recorded if op == "bxor" else actual - recorded
    return torch.where(same, torch.zeros_like(d), d)


def _changed(dev: torch.Tensor) -> torch.Tensor:
    return (dev != 0) | torch.isnan(dev) if dev.is_floating_point() else dev != 0


def add_deviation(value: torch.Tensor, dev: torch.Tensor | None, op: str) -> torch.Tensor:
    """``value + dev`` where dev is non-zero; ``value`` itself, bit for bit, elsewhere."""
    if dev is None:
        return value
    moved = value ^ dev if op == "bxor" else value + dev
    return torch.where(_changed(dev), moved, value)


def merge_deviations(devs: Sequence[torch.Tensor | None], op: str) -> torch.Tensor | None:
    present = [d for d in devs if d is not None]
    if not present:
        return None
    acc = present[0]
    for d in present[1:]:
        acc = acc ^ d if op == "bxor" else acc + d
    return acc


def finish_deviation(dev: torch.Tensor | None, op: str, n: int) -> torch.Tensor | None:
    """The deviation of a finished value: avg divides by n (truncating for integers, so an
    integer avg is within ±1 of the exact one)."""
    if dev is None or op != "avg":
        return dev
    return dev / n if dev.is_floating_point() else torch.div(dev, n, rounding_mode="trunc")


# ------------------------------------------------------------------------------ tree order


def tree_partials(inputs: Sequence[torch.Tensor], op: str) -> list[torch.Tensor]:
    """Every node's unfinished subtree reduction in the tree's order: ``acc = own`` then
    ``acc = op(acc, child)`` for the children in :func:`tree_fold_order`. Inputs are flat and
    already premultiplied for premul_sum."""
    n = len(inputs)
    out: list[torch.Tensor | None] = [None] * n
    for r in reversed(range(n)):  # children have larger indices than parents
        acc = inputs[r].clone()
        for c in tree_fold_order(r, n):
            acc = combine(acc, out[c], op)
        out[r] = acc
    return out  # type: ignore[return-value]


def tree_reduce(inputs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The finished tree all-reduce value (what a real tree computes; not the collector's)."""
    return finish(tree_partials(inputs, op)[0], op, len(inputs))


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True, eq=False)
class RecordedCollective:
    """What the collector saves for one collective instance so that sandbox set ``sandbox`` can
    later run it pruned. Tensors are flat (``reshape(-1)``), in the op's dtype, keyed by group rank.

    Size: one output and one input per sandbox rank, plus one input-sized tensor per ring block
    (reductions), or one per vrank child of a sandbox node (tree).
    """

    algo: Algo
    group_size: int
    sandbox: tuple[int, ...]
    """Group ranks that run for real; sorted."""
    reduce_op: str = ""
    root: int = 0
    """Broadcast root; send/recv source."""
    peer: int = -1
    """Send/recv destination."""
    inputs: Mapping[int, torch.Tensor] = field(default_factory=dict)
    """Each sandbox rank's recorded input (its contribution); for divergence checks and, with
    ``entry_partials``, the recorded partials at every sandbox position."""
    outputs: Mapping[int, torch.Tensor] = field(default_factory=dict)
    """What the collector returned to each sandbox rank (the full value for all-reduce,
    all-gather and broadcast; the owned chunk for reduce-scatter; the received blocks for
    all-to-all; the message for a receiving send/recv peer)."""
    premul: Mapping[int, float] = field(default_factory=dict)
    """premul_sum: each sandbox rank's factor."""
    entry_partials: Mapping[int, torch.Tensor] = field(default_factory=dict)
    """Ring reductions: for the first rank ``b`` of each sandbox block, an input-sized tensor
    whose chunk ``c`` is the recorded fold of chunk c over ranks ``c+1 .. b-1`` (what the vrank
    before the block sends). Zeros for chunk ``b-1`` (never sent)."""
    subtree_partials: Mapping[int, torch.Tensor] = field(default_factory=dict)
    """Tree: for each vrank child of a sandbox node, its recorded unfinished subtree reduction."""
    partner_inputs: Mapping[int, torch.Tensor] = field(default_factory=dict)
    """An all-reduce of a group of two with one sandbox rank: the other member's whole input, keyed
    by the sandbox rank; what the vrank sends when the op runs as one exchange (:mod:`.pair`)."""
    in_splits: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """All-to-all: rows each sandbox rank sends to each group rank."""
    out_splits: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """All-to-all: rows each sandbox rank receives from each group rank."""
    row_numel: int = 1
    """All-to-all: elements per row (dim-0 slice)."""

    def __post_init__(self) -> None:
        assert tuple(sorted(set(self.sandbox))) == self.sandbox, "sandbox ranks must be sorted and unique"
        if self.algo.reduces and self.reduce_op not in REDUCE_OPS:
            raise PrismError(f"{self.algo.value}: unknown reduce op {self.reduce_op!r}")

    def restrict(self, sandbox_group_ranks: Sequence[int]) -> RecordedCollective:
        """The record of a subset of this record's sandbox set, computed from this record alone
        (no other rank's input is needed): equal, bit for bit, to what :func:`record_for_sandbox`
        gives for the subset. So data collected for ranks 0-7 serves an emulation of ranks 2,5.

        The subset's ring blocks start at ranks whose predecessor is either a sandbox rank of this
        record (its recorded prefix is rebuilt from the recorded inputs) or the vrank before one of
        this record's blocks (its entry partial is stored); a tree child outside the subset is a
        sandbox rank here (its subtree is rebuilt) or a stored vrank child."""
        subset = tuple(sorted(set(sandbox_group_ranks)))
        if not subset or not set(subset) <= set(self.sandbox):
            raise PrismError(f"{self.algo.value}: cannot restrict the record of group ranks {list(self.sandbox)} "
                             f"to {list(subset)} (not a non-empty subset)")
        if subset == self.sandbox:
            return self

        def pick(m: Mapping) -> dict:
            return {s: v for s, v in m.items() if s in subset}

        kw: dict = {"inputs": pick(self.inputs), "outputs": pick(self.outputs), "premul": pick(self.premul),
                    "in_splits": pick(self.in_splits), "out_splits": pick(self.out_splits)}
        values = RecordedValues(self)
        n = self.group_size
        if self.algo in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER):
            entries = {}
            for block in ring_blocks(n, subset):
                b = block[0]
                entry = torch.zeros_like(next(iter(self.inputs.values())))
                for c, (lo, hi) in enumerate(values.bounds):
                    if hi > lo and ring_order(c, n).index(b) > 0:
                        entry[lo:hi] = values.ring_partial((b - 1) % n, c)
                entries[b] = entry
            kw["entry_partials"] = entries
        elif self.algo is Algo.TREE_ALL_REDUCE:
            kw["subtree_partials"] = {c: values.tree_partial(c) for s in subset for c in tree_children(s, n)
                                      if c not in subset}
        if self.algo in (Algo.RING_ALL_REDUCE, Algo.TREE_ALL_REDUCE) and n == 2 and len(subset) == 1:
            kw["partner_inputs"] = {subset[0]: self.inputs[1 - subset[0]]}
        return RecordedCollective(self.algo, n, subset, reduce_op=self.reduce_op, root=self.root, peer=self.peer,
                                  row_numel=self.row_numel, **kw)


def _premultiplied(flat: torch.Tensor, op: str, factor: float | None) -> torch.Tensor:
    return flat * factor if op == "premul_sum" else flat


def record_for_sandbox(
    inputs_by_group_rank: Sequence[torch.Tensor],
    algo: Algo,
    reduce_op: str,
    sandbox_group_ranks: Sequence[int],
    *,
    root: int = 0,
    peer: int = -1,
    premul: Sequence[float] | None = None,
    in_splits: Sequence[Sequence[int]] | None = None,
) -> RecordedCollective:
    """Compute, from every rank's input (which the collector has), what must be saved for
    ``sandbox_group_ranks``. The outputs are the collector's (prism's ring order,
    :mod:`~prism.nccl_patches.reduction`), whatever the emulation algorithm is."""
    n = len(inputs_by_group_rank)
    sandbox = tuple(sorted(set(sandbox_group_ranks)))
    if not sandbox:
        raise PrismError(f"{algo.value}: no sandbox rank to record for")
    if not all(0 <= s < n for s in sandbox):
        raise PrismError(f"{algo.value}: sandbox ranks {sandbox} outside a group of {n}")
    flat = [t.reshape(-1) for t in inputs_by_group_rank]
    if algo is Algo.P2P:
        src, dst = root, peer
        return RecordedCollective(
            algo, n, sandbox, root=src, peer=dst,
            inputs={s: flat[s] for s in sandbox if s == src},
            outputs={s: flat[src] for s in sandbox if s == dst},
        )
    kw: dict = {"inputs": {s: flat[s] for s in sandbox}}
    if algo.reduces:
        if reduce_op == "premul_sum":
            assert premul is not None and len(premul) == n, "premul_sum needs one factor per rank"
            kw["premul"] = {s: premul[s] for s in sandbox}
        own = [_premultiplied(f, reduce_op, premul[r] if premul else None) for r, f in enumerate(flat)]
    if algo in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.TREE_ALL_REDUCE):
        from .reduction import ring_reduce  # the collector's own function

        full = ring_reduce(flat, reduce_op, premul=premul)
        if algo is Algo.RING_REDUCE_SCATTER:
            bounds = chunk_bounds(full.numel(), n)
            kw["outputs"] = {s: full[bounds[s][0] : bounds[s][1]] for s in sandbox}
        else:
            kw["outputs"] = dict.fromkeys(sandbox, full)
        if algo is Algo.TREE_ALL_REDUCE:
            partials = tree_partials(own, reduce_op)
            kw["subtree_partials"] = {
                c: partials[c] for s in sandbox for c in tree_children(s, n) if c not in sandbox
            }
        else:
            kw["entry_partials"] = _entry_partials(own, reduce_op, sandbox)
        if algo is not Algo.RING_REDUCE_SCATTER and n == 2 and len(sandbox) == 1:
            kw["partner_inputs"] = {sandbox[0]: flat[1 - sandbox[0]]}
    elif algo is Algo.RING_ALL_GATHER:
        kw["outputs"] = dict.fromkeys(sandbox, torch.cat(flat))
    elif algo is Algo.CHAIN_BROADCAST:
        kw["outputs"] = dict.fromkeys(sandbox, flat[root])
    elif algo is Algo.DIRECT_ALL_TO_ALL:
        rows = [t.shape[0] if t.dim() else 1 for t in inputs_by_group_rank]
        row_numel = math.prod(inputs_by_group_rank[0].shape[1:])
        splits = [tuple(s) for s in in_splits] if in_splits is not None else [(rows[i] // n,) * n for i in range(n)]
        for i in range(n):
            if sum(splits[i]) != rows[i] or len(splits[i]) != n:
                raise PrismError(f"all_to_all: rank {i}'s splits {splits[i]} do not cover its {rows[i]} rows")
        offsets = [[sum(splits[i][:j]) * row_numel for j in range(n + 1)] for i in range(n)]
        outputs = {
            j: torch.cat([flat[i][offsets[i][j] : offsets[i][j + 1]] for i in range(n)]) for j in sandbox
        }
        kw.update(
            outputs=outputs,
            in_splits={s: splits[s] for s in sandbox},
            out_splits={s: tuple(splits[i][s] for i in range(n)) for s in sandbox},
            row_numel=row_numel,
        )
    else:  # pragma: no cover - exhaustive
        raise AssertionError(algo)
    return RecordedCollective(algo, n, sandbox, reduce_op=reduce_op, root=root, peer=peer, **kw)


def _entry_partials(own: Sequence[torch.Tensor], op: str, sandbox: tuple[int, ...]) -> dict[int, torch.Tensor]:
    n = len(own)
    if len(sandbox) == n:
        return {}
    bounds = chunk_bounds(own[0].numel(), n)
    out = {}
    for block in ring_blocks(n, sandbox):
        b = block[0]
        entry = torch.zeros_like(own[0])
        for c, (lo, hi) in enumerate(bounds):
            order = ring_order(c, n)
            stop = order.index(b)  # fold order[0 .. stop-1]
            if stop == 0 or hi == lo:
                continue
            acc = own[order[0]][lo:hi].clone()
            for r in order[1:stop]:
                acc = combine(acc, own[r][lo:hi], op)
            entry[lo:hi] = acc
        out[b] = entry
    return out


class RecordedValues:
    """Derived recorded values, computed on demand and cached (one per collective and endpoint)."""

    def __init__(self, rec: RecordedCollective) -> None:
        self.rec = rec
        self.n = rec.group_size
        self.sandbox = frozenset(rec.sandbox)
        self._own: dict[int, torch.Tensor] = {}
        self._ring: dict[tuple[int, int], torch.Tensor] = {}
        self._tree: dict[int, torch.Tensor] = {}
        first = next(iter(rec.inputs.values()), None)
        self.bounds = chunk_bounds(first.numel(), self.n) if first is not None else []

    def own(self, s: int) -> torch.Tensor:
        """A sandbox rank's recorded contribution (premultiplied for premul_sum)."""
        if s not in self._own:
            self._own[s] = _premultiplied(self.rec.inputs[s], self.rec.reduce_op, self.rec.premul.get(s))
        return self._own[s]

    def full(self) -> torch.Tensor:
        """The collected result every rank got (all-reduce, all-gather, broadcast)."""
        return self.rec.outputs[self.rec.sandbox[0]]

    def chunk(self, t: torch.Tensor, c: int) -> torch.Tensor:
        lo, hi = self.bounds[c]
        return t[lo:hi]

    def ring_partial(self, rank: int, c: int) -> torch.Tensor:
        """Recorded partial of chunk ``c`` once ``rank`` folded in: rank is a sandbox rank, or the
        vrank just before a block."""
        key = (rank, c)
        if key in self._ring:
            return self._ring[key]
        n, op = self.n, self.rec.reduce_op
        if rank not in self.sandbox:
            nxt = (rank + 1) % n
            assert nxt in self.rec.entry_partials, f"vrank {rank} does not precede a sandbox block"
            value = self.chunk(self.rec.entry_partials[nxt], c)
        else:
            order = ring_order(c, n)
            idx = order.index(rank)
            j = idx
            while j > 0 and order[j - 1] in self.sandbox:
                j -= 1
            if j == 0:
                value = self.chunk(self.own(order[0]), c).clone()
                j = 1
            else:
                value = self.chunk(self.rec.entry_partials[order[j]], c)
            for r in order[j : idx + 1]:
                value = combine(value, self.chunk(self.own(r), c), op)
        self._ring[key] = value
        return value

    def tree_partial(self, u: int) -> torch.Tensor:
        """Recorded unfinished subtree reduction at ``u`` (a sandbox rank or a stored vrank child)."""
        if u in self._tree:
            return self._tree[u]
        if u not in self.sandbox:
            value = self.rec.subtree_partials[u]
        else:
            value = self.own(u).clone()
            for c in tree_fold_order(u, self.n):
                value = combine(value, self.tree_partial(c), self.rec.reduce_op)
        self._tree[u] = value
        return value
