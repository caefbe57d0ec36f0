"""Run a pruned collective: from a sandbox rank's side, from a vrank endpoint's side, or all
parties in one process.

* The ``live`` comm engine (prism.sandbox) calls :func:`run_sandbox_side` for each collective of a
  sandbox rank, with the rank's real tensors, over the group's :class:`Transport`.
* The replayer (prism.vrank_replayer) calls :func:`run_neighbor_side` with the
  :class:`RecordedCollective` and the neighbor vranks it hosts (:func:`plan_endpoints` says which
  vranks need one).
* :func:`run_in_process` runs every party of one collective in this process, exchanging the
  messages in memory in the same step order: the same algorithms without processes (for tests at
  large group sizes and for dry runs).

A vrank endpoint over gloo, and any party of a direct all-to-all over gloo, posts its receives
ahead and each send as soon as the receive it depends on (the latest earlier receive of the same
chunk) is in. A sandbox rank's other collectives, and every party over NCCL, run step by step:
post a step's sends and receives, complete the receives in ``(src, dst)`` order, wait for the
sends. A message of step ``t`` depends only on steps ``< t``, so neither can deadlock
(:func:`start_party`).
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from prism.core.errors import PrismError

from .compensation import RecordedCollective
from .parties import NeighborParty, Party, SandboxParty, recorded_geometry
from .schedule import Algo, LinkTraffic, Step, neighbor_vranks, steps_touching, vranks_touching
from .transport import Transport

__all__ = [
    "SandboxResult",
    "NeighborResult",
    "run_sandbox_side",
    "run_neighbor_side",
    "run_party",
    "start_party",
    "start_sandbox_side",
    "run_in_process",
    "neighbor_ranks",
    "pruned_steps",
]


@dataclass(frozen=True, slots=True)
class SandboxResult:
    output: torch.Tensor | None
    """The rank's flat output (None for the sender of a send/recv)."""
    diverged: bool
    """The rank's input differs from the recorded one (its outputs are recorded + Δ, not the
    collected values); False when nothing was recorded."""
    traffic: dict[tuple[int, int], LinkTraffic]
    """Bytes and steps per directed link of this collective, as counted by the transport."""


@dataclass(frozen=True, slots=True)
class NeighborResult:
    traffic: dict[tuple[int, int], LinkTraffic]
    num_steps: int


def pruned_steps(rec: RecordedCollective) -> list[Step]:
    """``rec``'s schedule pruned to the steps that touch a sandbox rank (O(n) for a ring of n: compute
    it once per op and hand it to :func:`neighbor_ranks` and :class:`NeighborParty`)."""
    return steps_touching(rec.algo, recorded_geometry(rec), rec.sandbox)


def neighbor_ranks(rec: RecordedCollective, pruned: Sequence[Step] | None = None) -> frozenset[int]:
    """The vranks that exchange messages with the sandbox ranks and need a live endpoint; every
    other vrank of the group is pruned. ``pruned``: :func:`pruned_steps` of ``rec``, when known;
    without it the set is kept per schedule and no steps are walked."""
    if pruned is None:
        return vranks_touching(rec.algo, recorded_geometry(rec), rec.sandbox)
    return frozenset(neighbor_vranks(pruned, rec.sandbox))


def _by_step(steps: Sequence[Step]) -> Iterable[tuple[int, list[Step]]]:
    for t, group in itertools.groupby(steps, key=lambda s: s.t):
        yield t, list(group)


def start_party(
    party: Party, transport: Transport, n: int, *, tag_base: int = 0, timeout_s: float = 120.0
) -> Callable[[], dict[tuple[int, int], LinkTraffic]]:
    """Post the messages that depend on nothing received now; the returned function drives the
    rest and returns the traffic (``run_party`` is ``start_party(...)()``). Posting them early
    changes nothing but when they leave: a vrank's send goes out on the thread that decided it is
    due, and another thread may wait for it.

    Two drivers:

    * **by dependency** (:func:`_start_by_dependency`): receives posted ahead, each send as soon
      as the receive it depends on is in. Vrank endpoints over gloo (posting never blocks) run so,
      as real vranks pass a chunk on the moment it arrives, and so does every direct all-to-all
      over gloo, whose blocks depend on nothing received (gloo's alltoallv posts every round
      before it waits for any).
    * **lockstep** (:func:`_start_lockstep`): a sandbox rank's rings, trees, chains and
      send/recv over gloo keep gloo's own pace, a round's receive announced when the round
      starts (posting a sandbox rank's receives ahead was measured on 16 cores in session 20 and
      moved the calibrated predictions 1.6-2.1 points away from the real runs, docs/emulate.md),
      and every party over NCCL, whose point-to-point ops on one stream run in the order posted."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if transport.posts_without_blocking and (
        isinstance(party, NeighborParty) or party.algo is Algo.DIRECT_ALL_TO_ALL
    ):
        return _start_by_dependency(party, transport, n, tag_base, timeout, timeout_s)
    return _start_lockstep(party, transport, n, tag_base, timeout, timeout_s)


def _start_lockstep(
    party: Party, transport: Transport, n: int, tag_base: int, timeout: datetime.timedelta, timeout_s: float
) -> Callable[[], dict[tuple[int, int], LinkTraffic]]:
    """Step by step: a step's sends and receives are posted together once the earlier steps'
    receives are in, and its sends are done before the next step."""
    groups = [steps for _, steps in _by_step(party.steps)]
    first_sends = _post_sends(party, transport, n, groups[0], tag_base) if groups else []

    def finish() -> dict[tuple[int, int], LinkTraffic]:
        for k, steps in enumerate(groups):
            sends = first_sends if k == 0 else _post_sends(party, transport, n, steps, tag_base)
            recvs = []
            for st in steps:
                if st.dst in party.hosted:
                    buf = party.recv_buffer(st)
                    recvs.append((st, buf, transport.recv(buf, st.src, st.dst, tag_base + st.tag(n))))
            if k == 0:
                party.in_flight()
            for st, buf, work in recvs:
                if not work.wait(timeout):
                    raise PrismError(f"pruned collective: step {st} timed out after {timeout_s}s")
                party.incoming(st, buf)
            for work in sends:
                work.wait(timeout)
        return _traffic(party)

    return finish


_MAX_BYTES_POSTED_AHEAD = 64 << 20
"""Receive buffers a party keeps posted ahead of the receive it waits for (at least one receive)."""


def _sends_released(party: Party, recv_steps: Sequence[Step]) -> dict[int, list[Step]]:
    """The party's sends keyed by the index (in ``recv_steps``, the party's receives in order) of
    the receive that releases each; -1: depends on nothing received.

    Every algorithm of :mod:`.schedule` moves a chunk's value forward: a message of chunk ``c``
    at step ``t`` is built from what its sender last received of chunk ``c`` (a ring's partial
    sums and finished chunks, a tree's or chain's single chunk), and an all-to-all block
    (chunk = its source) from nothing received. So a send waits for the latest receive of its
    chunk at an earlier step, which may have reached another rank the party hosts, the value
    passing between its ranks inside the party (pruned vranks between two endpoints of a ring).
    Receives are completed in order, so every earlier receive is in too."""
    latest: dict[int, int] = {}  # chunk -> its latest receive before the send being placed
    released: dict[int, list[Step]] = {}
    j = 0
    # a party's steps are its pruned schedule's, already in execution order (step, sender, receiver)
    for st in party.steps:
        if st.src not in party.hosted:
            continue
        while j < len(recv_steps) and recv_steps[j].t < st.t:
            latest[recv_steps[j].chunk] = j
            j += 1
        released.setdefault(latest.get(st.chunk, -1), []).append(st)
    return released


class _PostedAhead:
    """The party's receives, posted in order while their buffers fit in ``budget`` bytes."""

    def __init__(self, party: Party, transport: Transport, n: int, tag_base: int, budget: int) -> None:
        self.steps = [st for st in party.steps if st.dst in party.hosted]
        self._party, self._transport, self._n, self._tag_base = party, transport, n, tag_base
        self._budget, self._posted_bytes = budget, 0
        self._posted: list[tuple[torch.Tensor, object]] = []
        self._taken = 0

    def post(self, until_t: int | None = None) -> None:
        """Post further receives while they fit (the next one always, when none is posted), up to
        the first receive of a step after ``until_t``."""
        while len(self._posted) < len(self.steps):
            st = self.steps[len(self._posted)]
            size = st.numel * self._party.dtype.itemsize
            if until_t is not None and st.t > until_t:
                return
            if self._posted_bytes + size > self._budget and len(self._posted) > self._taken:
                return
            buf = self._party.recv_buffer(st)
            work = self._transport.recv(buf, st.src, st.dst, self._tag_base + st.tag(self._n))
            self._posted.append((buf, work))
            self._posted_bytes += size

    def take(self, k: int) -> tuple[torch.Tensor, object]:
        """Receive ``k``'s buffer and work (receives are taken in order); its bytes leave the budget."""
        assert k == self._taken < len(self._posted), f"receive {k} taken out of order or not posted"
        buf, work = self._posted[k]
        self._posted[k] = (None, None)  # the party owns the buffer from here on
        self._taken += 1
        self._posted_bytes -= self.steps[k].numel * self._party.dtype.itemsize
        return buf, work


def _start_by_dependency(
    party: Party, transport: Transport, n: int, tag_base: int, timeout: datetime.timedelta, timeout_s: float
) -> Callable[[], dict[tuple[int, int], LinkTraffic]]:
    """:func:`start_party` over a transport whose posts never block (gloo): receives are posted
    ahead (within :data:`_MAX_BYTES_POSTED_AHEAD`), so each sender finds its receiver ready (gloo
    sends a message's data once the receiver has announced the receive), and each send as soon as
    the receive it depends on is in (:func:`_sends_released`), not when its whole step is.

    Step by step, a vrank's message of step t + 1 waited for every sandbox rank's message of step
    t: with two sandbox ranks each ring step cost a round trip through the endpoint and the slower
    of the two (moe-sleep's all-reduces, W=8, sandbox {2,5}: 1.45 ms emulated against 1.07 in its
    calibration slices)."""
    ahead = _PostedAhead(party, transport, n, tag_base, _MAX_BYTES_POSTED_AHEAD)
    released = _sends_released(party, ahead.steps)
    sends = _post_sends(party, transport, n, released.get(-1, []), tag_base)
    if ahead.steps:
        ahead.post(until_t=ahead.steps[0].t)
    # after the first step's receives: a later one may land in an input that is also the output
    party.in_flight()
    ahead.post()

    def finish() -> dict[tuple[int, int], LinkTraffic]:
        for k, st in enumerate(ahead.steps):
            buf, work = ahead.take(k)
            if not work.wait(timeout):
                raise PrismError(f"pruned collective: step {st} timed out after {timeout_s}s")
            party.incoming(st, buf)
            sends.extend(_post_sends(party, transport, n, released.get(k, []), tag_base))
            ahead.post()
        for work in sends:
            work.wait(timeout)
        return _traffic(party)

    return finish


def _traffic(party: Party) -> dict[tuple[int, int], LinkTraffic]:
    """The party's own messages (its steps are the ones with an end it hosts), counted from its
    steps: a diff of the transport's counters would also count what other threads sent on the
    same transport meanwhile."""
    traffic: dict[tuple[int, int], list[int]] = {}
    for st in party.steps:
        counts = traffic.setdefault((st.src, st.dst), [0, 0])
        counts[0] += st.numel * party.dtype.itemsize
        counts[1] += 1
    return {k: LinkTraffic(b, m) for k, (b, m) in traffic.items()}


def _post_sends(party: Party, transport: Transport, n: int, steps: list[Step], tag_base: int) -> list:
    sends = []
    for st in steps:
        if st.src in party.hosted:
            assert st.dst not in party.hosted, f"step {st} would stay inside one endpoint"
            value = party.outgoing(st).contiguous()
            assert value.numel() == st.numel and value.dtype == party.dtype, f"step {st}: {value.numel()} {value.dtype}"
            sends.append(transport.send(value, st.src, st.dst, tag_base + st.tag(n)))
    return sends


def run_party(
    party: Party, transport: Transport, n: int, *, tag_base: int = 0, timeout_s: float = 120.0
) -> dict[tuple[int, int], LinkTraffic]:
    """Drive one party's steps over the transport; returns the traffic of these steps.

    Message tags are ``tag_base + step.tag(n)`` (below ``2·n²``): collectives that may overlap on
    one transport need disjoint ranges (e.g. ``tag_base = (seq % 1024) * 2 * n * n``)."""
    return start_party(party, transport, n, tag_base=tag_base, timeout_s=timeout_s)()


def run_sandbox_side(transport: Transport, algo: Algo, rank: int, data: torch.Tensor, **kw) -> SandboxResult:
    """Run group rank ``rank``'s real steps of ``algo`` with its real ``data`` (see
    :class:`SandboxParty` for what ``data`` is per op); the keywords are :func:`start_sandbox_side`'s.
    ``recorded`` is needed only for the tree's root selection and for the divergence flag; the ring
    steps themselves need nothing recorded. ``out``: where the result is built (:class:`SandboxParty`)."""
    return start_sandbox_side(transport, algo, rank, data, **kw)()


def start_sandbox_side(
    transport: Transport,
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
    tag_base: int = 0,
    timeout_s: float = 120.0,
) -> Callable[[], SandboxResult]:
    """:func:`run_sandbox_side` in two halves: build the party and post its first step now
    (:func:`start_party`); the returned function drives the rest and gives the result (the ``live``
    engine may begin an op on the script's thread and finish it on the op's channel thread)."""
    party = SandboxParty(
        algo, rank, data, group_size=group_size, reduce_op=reduce_op, root=root, peer=peer,
        premul=premul, in_splits=in_splits, out_splits=out_splits, recorded=recorded, out=out,
    )
    finish = start_party(party, transport, group_size, tag_base=tag_base, timeout_s=timeout_s)

    def result() -> SandboxResult:
        traffic = finish()
        return SandboxResult(party.output(), party.diverged, traffic)

    return result


def run_neighbor_side(
    transport: Transport,
    recorded: RecordedCollective,
    hosted: Iterable[int],
    *,
    tag_base: int = 0,
    timeout_s: float = 120.0,
) -> NeighborResult:
    """Play the neighbor vranks ``hosted`` (a subset of :func:`neighbor_ranks`) of one collective."""
    party = NeighborParty(recorded, hosted)
    traffic = run_party(party, transport, recorded.group_size, tag_base=tag_base, timeout_s=timeout_s)
    return NeighborResult(traffic, len(party.steps))


def run_in_process(parties: Sequence[Party]) -> dict[tuple[int, int], LinkTraffic]:
    """Run all parties of one collective here, delivering messages in memory in step order.
    Every step must have exactly one sending and one receiving party. Returns the traffic."""
    owner: dict[int, Party] = {}
    for p in parties:
        for r in p.hosted:
            if r in owner:
                raise PrismError(f"group rank {r} is hosted by two parties")
            owner[r] = p
    known = {id(p): set(p.steps) for p in parties}
    steps = sorted({st for p in parties for st in p.steps}, key=lambda s: (s.t, s.src, s.dst))
    for p in parties:
        p.in_flight()
    traffic: dict[tuple[int, int], LinkTraffic] = {}
    for _, group in _by_step(steps):
        messages = []
        for st in group:
            if st.src not in owner or st.dst not in owner:
                raise PrismError(f"step {st} has no party for group rank {st.src if st.src not in owner else st.dst}")
            for end in (st.src, st.dst):
                if st not in known[id(owner[end])]:
                    raise PrismError(f"step {st}: the party of group rank {end} does not expect it")
            value = owner[st.src].outgoing(st)
            assert value.numel() == st.numel, f"step {st}: sent {value.numel()} elements"
            messages.append((st, value.clone()))
        for st, value in messages:
            owner[st.dst].incoming(st, value)
            key = (st.src, st.dst)
            traffic[key] = traffic.get(key, LinkTraffic()) + LinkTraffic(value.numel() * value.element_size(), 1)
    return traffic
