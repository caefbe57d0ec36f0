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

Steps run in order; at each step a party posts all its sends, then completes its receives in
``(src, dst)`` order, then waits for its sends. A message of step ``t`` depends only on steps
``< t``, so this lockstep cannot deadlock. A direct all-to-all over gloo runs all its rounds as one
step, and a vrank endpoint of a ring over gloo sends each message once the earlier messages of its
chunk are in, not step by step (:func:`start_party`).
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
    """Post the party's first-step sends now; the returned function drives the rest and returns
    the traffic (``run_party`` is ``start_party(...)()``). A message of the first step depends on
    nothing received, so posting it early changes nothing but when it leaves: a vrank's send goes
    out on the thread that decided it is due, and another thread may wait for it. A direct
    all-to-all over gloo is one step: all its rounds are posted at once, as gloo's alltoallv does."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if _by_chunk(party, transport):
        return _start_by_chunk(party, transport, n, tag_base, timeout, timeout_s)
    if party.algo is Algo.DIRECT_ALL_TO_ALL and transport.posts_without_blocking and party.steps:
        # A direct all-to-all's rounds depend on nothing received, and gloo's own alltoallv posts
        # every round's send and receive before it waits for any: one batch, not n-1 lockstepped
        # round trips through this interpreter (moe-sleep's all-to-alls took 0.9-1.8 ms in the
        # calibration slices against 0.3-0.6 ms real, session 18).
        groups = [list(party.steps)]
    else:
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


_RING_ALGOS = frozenset({Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.RING_ALL_GATHER})
_MAX_BYTES_POSTED_AHEAD = 64 << 20
"""A vrank endpoint posts every receive of a ring op at once only up to this many bytes of buffers."""


def _by_chunk(party: Party, transport: Transport) -> bool:
    """Whether ``party`` sends each vrank message once the messages it depends on are in, rather
    than step by step: vrank endpoints of a ring over gloo (which posts without blocking)."""
    if not (isinstance(party, NeighborParty) and party.algo in _RING_ALGOS and transport.posts_without_blocking):
        return False
    posted = sum(st.numel for st in party.steps if st.dst in party.hosted) * party.dtype.itemsize
    return posted <= _MAX_BYTES_POSTED_AHEAD


def _start_by_chunk(
    party: Party, transport: Transport, n: int, tag_base: int, timeout: datetime.timedelta, timeout_s: float
) -> Callable[[], dict[tuple[int, int], LinkTraffic]]:
    """:func:`start_party` for a vrank endpoint of a ring: every receive is posted now, and each
    send as soon as the receives it depends on are in. In a ring a chunk's message at step t is
    what its sender received of that chunk at t - 1, so a vrank's message depends only on the
    earlier messages of its chunk that reached the endpoint (through the pruned vranks between
    them), and :class:`NeighborParty` keeps its state per chunk. Step by step, a vrank's message
    of step t + 1 waited for every sandbox rank's message of step t: with two sandbox ranks each
    ring step cost a round trip through this endpoint and the slower of the two (moe-sleep's
    all-reduces, W=8, sandbox {2,5}: 1.45 ms emulated against 1.07 in its calibration slices)."""
    # a party's steps are its pruned schedule's, already in execution order (step, sender, receiver)
    recv_steps = [st for st in party.steps if st.dst in party.hosted]
    send_steps = [st for st in party.steps if st.src in party.hosted]
    after: dict[int, list[Step]] = {}  # index of a receive -> the sends its arrival releases (-1: none)
    latest: dict[int, int] = {}  # chunk -> its latest receive before the send being placed
    j = 0
    for st in send_steps:
        while j < len(recv_steps) and recv_steps[j].t < st.t:
            latest[recv_steps[j].chunk] = j
            j += 1
        after.setdefault(latest.get(st.chunk, -1), []).append(st)
    recvs = []
    for st in recv_steps:
        buf = party.recv_buffer(st)
        recvs.append((st, buf, transport.recv(buf, st.src, st.dst, tag_base + st.tag(n))))
    sends = _post_sends(party, transport, n, after.get(-1, []), tag_base)

    def finish() -> dict[tuple[int, int], LinkTraffic]:
        party.in_flight()
        for k, (st, buf, work) in enumerate(recvs):
            if not work.wait(timeout):
                raise PrismError(f"pruned collective: step {st} timed out after {timeout_s}s")
            party.incoming(st, buf)
            sends.extend(_post_sends(party, transport, n, after.get(k, []), tag_base))
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


def run_sandbox_side(
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
) -> SandboxResult:
    """Run group rank ``rank``'s real steps of ``algo`` with its real ``data`` (see
    :class:`SandboxParty` for what ``data`` is per op). ``recorded`` is needed only for the tree's
    root selection and for the divergence flag; the ring steps themselves need nothing recorded.
    ``out``: where the result is built (:class:`SandboxParty`)."""
    party = SandboxParty(
        algo, rank, data, group_size=group_size, reduce_op=reduce_op, root=root, peer=peer,
        premul=premul, in_splits=in_splits, out_splits=out_splits, recorded=recorded, out=out,
    )
    traffic = run_party(party, transport, group_size, tag_base=tag_base, timeout_s=timeout_s)
    return SandboxResult(party.output(), party.diverged, traffic)


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
