"""The real collective algorithms, step by step, as data; and their pruning to a sandbox subset.

A schedule is a list of :class:`Step`: at step ``t`` group rank ``src`` sends ``numel`` elements of
chunk ``chunk`` to group rank ``dst``. What the message holds follows from its :class:`Phase`:

* ``REDUCE`` (ring reduce-scatter phase): a partial reduction of the chunk. Chunk ``c`` starts at
  ``c+1`` and travels ``c+1 -> c+2 -> ... -> c``; the receiver folds its own slice in with
  ``acc = op(received, own)`` (the order of :mod:`prism.nccl_patches.reduction`), and the owner
  ``c`` finishes it (``completes``). At step ``s`` (0..n-2) rank ``r`` sends chunk ``r-1-s``.
* ``GATHER`` (ring all-gather phase, ring all-gather, chain broadcast): a finished value that the
  receiver keeps and forwards. In all-reduce, at step ``n-1+s`` rank ``r`` sends chunk ``r-s``.
* ``UP`` / ``DOWN`` (tree all-reduce): a subtree's partial reduction to the parent, then the final
  value from the parent to each child (see :func:`tree_parent`).
* ``EXCHANGE`` (direct all-to-all, send/recv): a block of data.

Choices (documented in docs/pruned-collectives.md):

* one message per chunk and step (NCCL pipelines each ring step in slices; the bytes per link and
  the order of messages per link are the same);
* broadcast is a non-pipelined chain ``root -> root+1 -> ... -> root-1``, one whole-tensor hop per
  step;
* all-to-all is a direct exchange in ``n-1`` rounds: in round ``k`` rank ``i`` sends to ``i+k``;
* the tree is a binary heap over group ranks (parent ``(r-1)//2``, root 0), not pipelined;
* a message of zero elements is not sent (no step), e.g. the empty chunks of a tensor with fewer
  elements than ranks.

Pruning keeps the steps with a sandbox endpoint; the other endpoint of such a step is a neighbor
vrank, or a sandbox rank (adjacent sandbox ranks talk directly). :func:`steps_touching` builds them
in O(|S|·n) without building the full O(n²) schedule; :func:`full_schedule` is the independent,
whole-group construction the tests compare it with.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "Algo",
    "Phase",
    "Step",
    "Geometry",
    "LinkTraffic",
    "full_schedule",
    "steps_touching",
    "prune",
    "link_traffic",
    "neighbor_vranks",
    "vranks_touching",
    "ring_blocks",
    "tree_parent",
    "tree_children",
    "tree_height",
    "tree_depth",
    "tree_fold_order",
    "chunk_numels",
    "critical_path",
]


class Algo(enum.Enum):
    RING_ALL_REDUCE = "ring_all_reduce"
    RING_REDUCE_SCATTER = "ring_reduce_scatter"
    RING_ALL_GATHER = "ring_all_gather"
    CHAIN_BROADCAST = "chain_broadcast"
    DIRECT_ALL_TO_ALL = "direct_all_to_all"
    P2P = "p2p"
    TREE_ALL_REDUCE = "tree_all_reduce"

    @property
    def reduces(self) -> bool:
        return self in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.TREE_ALL_REDUCE)


class Phase(enum.Enum):
    REDUCE = "RS"
    GATHER = "AG"
    UP = "UP"
    DOWN = "DN"
    EXCHANGE = "X"


@dataclass(frozen=True, slots=True)
class Step:
    """One message of a collective algorithm. Prints as ``t3 2->3 RS c1 128``."""

    t: int
    src: int
    dst: int
    phase: Phase
    chunk: int
    numel: int
    completes: bool = False
    """REDUCE: the receiver is the chunk's owner and finishes it (last reduce step of the chunk)."""

    def tag(self, n: int) -> int:
        """A message id unique within one collective: each rank receives one message per step,
        except a tree parent, which receives from both children in the same step (then the
        sender disambiguates)."""
        return self.t * n + (self.src if self.phase is Phase.UP else self.dst)

    def __str__(self) -> str:
        done = " done" if self.completes else ""
        return f"t{self.t} {self.src}->{self.dst} {self.phase.value} c{self.chunk} {self.numel}{done}"


def _order(step: Step) -> tuple[int, int, int]:
    """Execution order: by step, then sender, then receiver (unique within one schedule)."""
    return (step.t, step.src, step.dst)


@dataclass(frozen=True, slots=True)
class Geometry:
    """The sizes an algorithm needs: how many elements travel in which message."""

    n: int
    """Group size."""
    numel: int = 0
    """Ring all-reduce / reduce-scatter: elements of the whole (flat) input, split into n chunks.
    All-gather: elements of one rank's input (= one chunk). Broadcast, send/recv, tree: the tensor."""
    root: int = 0
    """Broadcast root; send/recv source (group ranks)."""
    peer: int = -1
    """Send/recv destination (group rank)."""
    block_numel: Callable[[int, int], int] | None = None
    """All-to-all: elements rank ``src`` sends to rank ``dst``; only called for pairs the
    schedule needs (a sandbox side knows its own row and column, a vrank side the recorded ones)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"group size must be at least 1, got {self.n}")


@dataclass(frozen=True, slots=True)
class LinkTraffic:
    num_bytes: int = 0
    num_steps: int = 0

    def __add__(self, other: LinkTraffic) -> LinkTraffic:
        return LinkTraffic(self.num_bytes + other.num_bytes, self.num_steps + other.num_steps)


def chunk_numels(numel: int, n: int) -> list[int]:
    """Elements of each ring chunk (:func:`prism.nccl_patches.reduction.chunk_bounds`)."""
    base, extra = divmod(numel, n)
    return [base + (1 if c < extra else 0) for c in range(n)]


# --------------------------------------------------------------------------------------- ring


def _ring_rs(n: int, sizes: list[int], src: int, t0: int = 0) -> Iterable[Step]:
    for s in range(n - 1):
        c = (src - 1 - s) % n
        yield Step(t0 + s, src, (src + 1) % n, Phase.REDUCE, c, sizes[c], completes=s == n - 2)


def _ring_ag(n: int, sizes: list[int], src: int, t0: int) -> Iterable[Step]:
    for s in range(n - 1):
        c = (src - s) % n
        yield Step(t0 + s, src, (src + 1) % n, Phase.GATHER, c, sizes[c])


def _ring_steps_from(algo: Algo, g: Geometry, src: int) -> Iterable[Step]:
    n = g.n
    if algo is Algo.RING_ALL_GATHER:
        yield from _ring_ag(n, [g.numel] * n, src, 0)
        return
    sizes = chunk_numels(g.numel, n)
    yield from _ring_rs(n, sizes, src)
    if algo is Algo.RING_ALL_REDUCE:
        yield from _ring_ag(n, sizes, src, n - 1)


# ------------------------------------------------------------------------------------- tree


def tree_parent(r: int) -> int:
    """Parent of group rank ``r`` in the binary heap tree (-1 for the root, 0)."""
    return (r - 1) // 2 if r > 0 else -1


def tree_children(r: int, n: int) -> list[int]:
    return [c for c in (2 * r + 1, 2 * r + 2) if c < n]


def tree_height(r: int, n: int) -> int:
    """0 for a leaf; 1 + the highest child's height otherwise (the step at which r sends up)."""
    h, frontier = 0, tree_children(r, n)
    while frontier:
        h += 1
        frontier = [c for f in frontier for c in tree_children(f, n)]
    return h


def tree_depth(r: int) -> int:
    return (r + 1).bit_length() - 1


def tree_fold_order(r: int, n: int) -> list[int]:
    """The order node r folds its children into ``acc = own``: by arrival step, then rank."""
    return sorted(tree_children(r, n), key=lambda c: (tree_height(c, n), c))


def _tree_steps_of(g: Geometry, r: int) -> Iterable[Step]:
    """Tree steps with r as an endpoint."""
    n = g.n
    top = tree_height(0, n)
    p = tree_parent(r)
    if p >= 0:
        yield Step(tree_height(r, n), r, p, Phase.UP, 0, g.numel)
        yield Step(top + tree_depth(r) - 1, p, r, Phase.DOWN, 0, g.numel)
    for c in tree_children(r, n):
        yield Step(tree_height(c, n), c, r, Phase.UP, 0, g.numel)
        yield Step(top + tree_depth(c) - 1, r, c, Phase.DOWN, 0, g.numel)


# --------------------------------------------------------------------------------- builders


def _numel_a2a(g: Geometry, src: int, dst: int) -> int:
    assert g.block_numel is not None, "all-to-all needs Geometry.block_numel"
    return g.block_numel(src, dst)


def full_schedule(algo: Algo, g: Geometry) -> list[Step]:
    """Every message of the whole-group algorithm, built step by step over all ranks."""
    n = g.n
    steps: list[Step] = []
    if n == 1:
        return steps
    if algo in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.RING_ALL_GATHER):
        for r in range(n):
            steps.extend(_ring_steps_from(algo, g, r))
    elif algo is Algo.CHAIN_BROADCAST:
        steps = [Step(s, (g.root + s) % n, (g.root + s + 1) % n, Phase.GATHER, 0, g.numel) for s in range(n - 1)]
    elif algo is Algo.DIRECT_ALL_TO_ALL:
        steps = [Step(k - 1, i, (i + k) % n, Phase.EXCHANGE, i, _numel_a2a(g, i, (i + k) % n))
                 for k in range(1, n) for i in range(n)]
    elif algo is Algo.P2P:
        steps = [Step(0, g.root, g.peer, Phase.EXCHANGE, 0, g.numel)]
    elif algo is Algo.TREE_ALL_REDUCE:
        top = tree_height(0, n)
        for c in range(1, n):
            steps.append(Step(tree_height(c, n), c, tree_parent(c), Phase.UP, 0, g.numel))
            steps.append(Step(top + tree_depth(c) - 1, tree_parent(c), c, Phase.DOWN, 0, g.numel))
    else:  # pragma: no cover - exhaustive
        raise AssertionError(algo)
    return sorted((s for s in steps if s.numel > 0), key=_order)


def steps_touching(algo: Algo, g: Geometry, ranks: Iterable[int]) -> list[Step]:
    """The steps with an endpoint in ``ranks`` (the pruned schedule for sandbox ``ranks``), each
    once, in execution order. Costs O(|ranks|·n), never the full schedule."""
    wanted = tuple(sorted(set(ranks)))
    if g.block_numel is None:  # every op of a group and size has the same schedule: build it once
        return list(_steps_touching_cached(algo, g, wanted))
    return _steps_touching(algo, g, wanted)


@functools.lru_cache(maxsize=4096)
def _steps_touching_cached(algo: Algo, g: Geometry, wanted: tuple[int, ...]) -> tuple[Step, ...]:
    return tuple(_steps_touching(algo, g, wanted))


def _steps_touching(algo: Algo, g: Geometry, wanted: tuple[int, ...]) -> list[Step]:
    n = g.n
    for r in wanted:
        if not 0 <= r < n:
            raise ValueError(f"group rank {r} is outside a group of {n}")
    found: set[Step] = set()
    if n > 1:
        for r in wanted:
            found.update(_steps_of(algo, g, r))
    return sorted((s for s in found if s.numel > 0), key=_order)


def _steps_of(algo: Algo, g: Geometry, r: int) -> Iterable[Step]:
    n = g.n
    if algo in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.RING_ALL_GATHER):
        yield from _ring_steps_from(algo, g, r)
        yield from _ring_steps_from(algo, g, (r - 1) % n)
    elif algo is Algo.CHAIN_BROADCAST:
        k = (r - g.root) % n
        if k >= 1:
            yield Step(k - 1, (r - 1) % n, r, Phase.GATHER, 0, g.numel)
        if k <= n - 2:
            yield Step(k, r, (r + 1) % n, Phase.GATHER, 0, g.numel)
    elif algo is Algo.DIRECT_ALL_TO_ALL:
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            yield Step(k - 1, r, dst, Phase.EXCHANGE, r, _numel_a2a(g, r, dst))
            yield Step(k - 1, src, r, Phase.EXCHANGE, src, _numel_a2a(g, src, r))
    elif algo is Algo.P2P:
        if r in (g.root, g.peer):
            yield Step(0, g.root, g.peer, Phase.EXCHANGE, 0, g.numel)
    elif algo is Algo.TREE_ALL_REDUCE:
        yield from _tree_steps_of(g, r)
    else:  # pragma: no cover - exhaustive
        raise AssertionError(algo)


def critical_path(algo: Algo, g: Geometry, rank: int) -> tuple[int, ...]:
    """The elements of each step of the whole-group algorithm, one entry per step ``t`` (in order),
    each the largest message of that step: the lock-stepped chain a collective's transfer takes once
    its last member has arrived. For all-to-all only the blocks of group rank ``rank`` are known (a
    sandbox side's row and column), so its rounds count those; the other algorithms do not depend
    on ``rank``. O(n) at most, never the O(n²) schedule."""
    n = g.n
    if n <= 1 or algo is Algo.P2P:
        return ()
    if algo is Algo.DIRECT_ALL_TO_ALL:
        rounds = (max(_numel_a2a(g, rank, (rank + k) % n), _numel_a2a(g, (rank - k) % n, rank)) for k in range(1, n))
        return tuple(m for m in rounds if m > 0)
    return _critical_path_cached(algo, g)


@functools.lru_cache(maxsize=4096)
def _critical_path_cached(algo: Algo, g: Geometry) -> tuple[int, ...]:
    """:func:`critical_path` of the algorithms whose path depends only on the geometry (one per
    group and size, asked once per op of a calibration slice)."""
    n = g.n
    if algo in (Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER):
        largest = -(-g.numel // n)  # the largest chunk (chunk_numels: they differ by at most one)
        steps = 2 * (n - 1) if algo is Algo.RING_ALL_REDUCE else n - 1
        return (largest,) * steps if largest > 0 else ()
    if algo in (Algo.RING_ALL_GATHER, Algo.CHAIN_BROADCAST):
        return (g.numel,) * (n - 1) if g.numel > 0 else ()
    if algo is Algo.TREE_ALL_REDUCE:
        top = tree_height(0, n)
        ts = {tree_height(c, n) for c in range(1, n)} | {top + tree_depth(c) - 1 for c in range(1, n)}
        return (g.numel,) * len(ts) if g.numel > 0 else ()
    raise AssertionError(algo)  # pragma: no cover - exhaustive


def prune(steps: Iterable[Step], sandbox: Iterable[int]) -> list[Step]:
    """Keep the steps that touch a sandbox rank (the rule, applied to a full schedule)."""
    s = set(sandbox)
    return [st for st in steps if st.src in s or st.dst in s]


def link_traffic(steps: Iterable[Step], itemsize: int) -> dict[tuple[int, int], LinkTraffic]:
    """Bytes and messages per directed link ``(src, dst)``."""
    out: dict[tuple[int, int], LinkTraffic] = {}
    for st in steps:
        key = (st.src, st.dst)
        out[key] = out.get(key, LinkTraffic()) + LinkTraffic(st.numel * itemsize, 1)
    return out


def neighbor_vranks(steps: Iterable[Step], sandbox: Iterable[int]) -> set[int]:
    """Non-sandbox endpoints of the (pruned) steps: the vranks that need a live endpoint."""
    s = set(sandbox)
    return {r for st in steps for r in (st.src, st.dst) if r not in s}


def vranks_touching(algo: Algo, g: Geometry, ranks: Iterable[int]) -> frozenset[int]:
    """``neighbor_vranks(steps_touching(algo, g, ranks), ranks)``, kept per schedule like the
    steps (walking a group of 512's pruned steps per op took 1.2 ms)."""
    wanted = tuple(sorted(set(ranks)))
    if g.block_numel is None:
        return _vranks_touching_cached(algo, g, wanted)
    return frozenset(neighbor_vranks(_steps_touching(algo, g, wanted), wanted))


@functools.lru_cache(maxsize=4096)
def _vranks_touching_cached(algo: Algo, g: Geometry, wanted: tuple[int, ...]) -> frozenset[int]:
    return frozenset(neighbor_vranks(_steps_touching_cached(algo, g, wanted), wanted))


def ring_blocks(n: int, sandbox: Iterable[int]) -> list[tuple[int, ...]]:
    """Maximal runs of consecutive sandbox ranks around the ring, each in ring order; the whole
    ring is one block whose first rank is 0 when every rank is a sandbox rank."""
    s = set(sandbox)
    if len(s) == n:
        return [tuple(range(n))]
    blocks = []
    for start in sorted(r for r in s if (r - 1) % n not in s):
        block = [start]
        while (block[-1] + 1) % n in s:
            block.append((block[-1] + 1) % n)
        blocks.append(tuple(block))
    return blocks
