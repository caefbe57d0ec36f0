"""What the sandbox side (the ``live`` engine) and the vrank side (the replayer) must agree on
without talking: how a logical op is cut into pruned collectives, who hosts which endpoint of a
group's transport, and which message tags an op uses.

* **Parts.** One logical op becomes one pruned collective per tensor it carries (coalesced ops,
  broadcast of several tensors), because the collector reduces each tensor on its own ring
  chunks. :func:`op_parts` gives each part's algorithm and this rank's flat data; the collector
  (through :mod:`.recorded_store`) and the ``live`` engine call the same function, so the recorded
  data and the running sandbox see the same tensors.
* **Endpoints.** A group's transport has one endpoint per sandbox member (in global-rank order)
  and, when the group has vranks, one more: the replayer :func:`replayer_of` picks for the group;
  it hosts *all* vranks of the group (full deviation propagation, docs/pruned-collectives.md).
* **Tags.** Ops of one group that may be in flight together get disjoint tag ranges
  (:func:`collective_tag_base`, :func:`p2p_tag_base`); :class:`WideTagTransport` folds a tag into
  gloo's 31-bit range for very large groups (a collective of n ranks uses tags below 2·n²).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from prism.core.errors import PrismError
from prism.graph.records import CommOp, NodeKind

from .compensation import RecordedCollective, record_for_sandbox
from .schedule import Algo, Phase, Step
from .transport import Transport

__all__ = [
    "Part",
    "op_parts",
    "EndpointPlan",
    "endpoint_plan",
    "sandbox_endpoints",
    "replayer_of",
    "transport_prefix",
    "collective_tag_base",
    "p2p_tag_base",
    "p2p_tag",
    "barrier_record",
    "WideTagTransport",
    "Lane",
    "device_lanes",
    "sends_input",
    "receives_output",
]


@dataclass(frozen=True, slots=True)
class Part:
    """One pruned collective of a logical op, from one group rank's side."""

    algo: Algo
    data: torch.Tensor
    """This rank's data for :func:`~prism.nccl_patches.run_sandbox_side` (flat, or rows for all-to-all)."""
    root: int = 0
    """Group rank: broadcast root, send/recv source."""
    peer: int = -1
    """Group rank: send/recv destination."""
    in_splits: tuple[int, ...] | None = None
    out_splits: tuple[int, ...] | None = None


def _flat(t: torch.Tensor) -> torch.Tensor:
    # detach only what autograd tracks: it is a dispatcher call of its own, on every op's issue
    return (t.detach() if t.requires_grad else t).reshape(-1)


def _cat_equal(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    sizes = {t.numel() for t in tensors}
    if len(sizes) > 1:
        raise PrismError(f"{what}: tensors of unequal sizes {sorted(sizes)} cannot run as one ring")
    return torch.cat([_flat(t) for t in tensors]) if tensors else torch.empty(0)


def op_parts(
    op: CommOp,
    inputs: Sequence[torch.Tensor],
    *,
    n: int,
    group_rank: int,
    root: int = -1,
    peer: int = -1,
    flat: bool = False,
    in_splits: Sequence[int] = (),
    out_splits: Sequence[int] = (),
    outputs: Sequence[torch.Tensor] | None = None,
    what: str = "",
) -> list[Part]:
    """The pruned collectives of one logical op and this rank's data for each.

    ``root``/``peer`` are group ranks. ``outputs`` (the rank's output buffers) are needed only by
    a rank that has no input of the op's size (a scatter non-root, an all-to-all list receiver);
    the recording side passes None and only the data of ranks that contribute matters there.
    Reduce, gather, scatter and barrier run as all-reduce, all-gather, broadcast and a one-element
    all-reduce (docs/virtual-ranks.md)."""
    what = what or op.value
    if op in (CommOp.ALL_REDUCE, CommOp.REDUCE):
        return [Part(Algo.RING_ALL_REDUCE, _flat(t)) for t in inputs]
    if op is CommOp.BROADCAST:
        return [Part(Algo.CHAIN_BROADCAST, _flat(t), root=root) for t in inputs]
    if op in (CommOp.ALL_GATHER, CommOp.GATHER):
        return [Part(Algo.RING_ALL_GATHER, _flat(t)) for t in inputs]
    if op is CommOp.REDUCE_SCATTER:
        if flat:
            return [Part(Algo.RING_REDUCE_SCATTER, _flat(t)) for t in inputs]
        return [Part(Algo.RING_REDUCE_SCATTER, _cat_equal(inputs, what))]
    if op is CommOp.SCATTER:
        if group_rank == root:
            data = _cat_equal(inputs, what)
        elif outputs is None:  # recording side: only the root's data is used
            data = torch.empty(0)
        else:
            data = torch.zeros(n * outputs[0].numel(), dtype=outputs[0].dtype, device=outputs[0].device)
        return [Part(Algo.CHAIN_BROADCAST, data, root=root)]
    if op is CommOp.ALL_TO_ALL:
        if flat:
            data = inputs[0].detach()
            rows = data.shape[0] if data.dim() else 1
            ins = tuple(in_splits) or (rows // n,) * n
            if outputs is not None:
                out_rows = outputs[0].shape[0] if outputs[0].dim() else 1
                outs = tuple(out_splits) or (out_rows // n,) * n
            else:
                outs = tuple(out_splits) or None
            return [Part(Algo.DIRECT_ALL_TO_ALL, data if data.dim() else data.reshape(1), in_splits=ins, out_splits=outs)]
        data = torch.cat([_flat(t) for t in inputs])
        outs = tuple(t.numel() for t in outputs) if outputs is not None else None
        return [Part(Algo.DIRECT_ALL_TO_ALL, data, in_splits=tuple(t.numel() for t in inputs), out_splits=outs)]
    if op is CommOp.BARRIER:
        return [Part(Algo.RING_ALL_REDUCE, torch.zeros(1, dtype=torch.int32))]
    if op in (CommOp.SEND, CommOp.RECV):
        tensors = inputs if op is CommOp.SEND else (outputs or ())
        return [Part(Algo.P2P, _flat(t), root=root, peer=peer) for t in tensors]
    raise PrismError(f"{what}: no pruned form for op {op.value}")


def barrier_record(n: int, sandbox: Iterable[int]) -> RecordedCollective:
    """A barrier's record needs no recording: every rank adds a zero. The same for every barrier
    of a group (its tensors are only read), so it is built once."""
    return _barrier_record(n, tuple(sorted(set(sandbox))))


@functools.lru_cache(maxsize=1024)
def _barrier_record(n: int, sandbox: tuple[int, ...]) -> RecordedCollective:
    zero = torch.zeros(1, dtype=torch.int32)
    return record_for_sandbox([zero] * n, Algo.RING_ALL_REDUCE, "sum", sandbox)


# ------------------------------------------------------------------------------- endpoints


def replayer_of(group_id: str, num_replayers: int) -> int:
    """The replayer that hosts every vrank of a group (stable across processes)."""
    return zlib.crc32(group_id.encode()) % max(1, num_replayers)


@dataclass(frozen=True, slots=True)
class EndpointPlan:
    """A group's transport as every party sees it."""

    group_id: str
    num_endpoints: int
    endpoint_of: dict[int, int]
    """Group rank -> endpoint (every vrank maps to the replayer's endpoint)."""
    replayer: int
    """Which replayer hosts the vranks (-1: the group has no vrank)."""

    @property
    def replayer_endpoint(self) -> int:
        return self.num_endpoints - 1


def sandbox_endpoints(members: Sequence[int], sandbox: Iterable[int]) -> dict[int, int]:
    """Group rank -> endpoint of each sandbox member of a group, in group-rank order."""
    sandbox = set(sandbox)
    return {g: e for e, g in enumerate(g for g, r in enumerate(members) if r in sandbox)}


def endpoint_plan(group_id: str, members: Sequence[int], sandbox: Iterable[int], num_replayers: int) -> EndpointPlan:
    """Endpoints of a group's transport: its sandbox members, then the replayer of its vranks."""
    endpoint_of = sandbox_endpoints(members, sandbox)
    k = len(endpoint_of)
    if k == len(members):
        return EndpointPlan(group_id, k, endpoint_of, -1)
    endpoint_of.update({g: k for g in range(len(members)) if g not in endpoint_of})
    return EndpointPlan(group_id, k + 1, endpoint_of, replayer_of(group_id, num_replayers))


def transport_prefix(group_id: str) -> str:
    return f"prism/transport/{group_id}"


# ------------------------------------------------------------------------------------ tags

_TAG_LIMIT = 2**31 - 1
_P2P_BASE = 2**30
_WINDOW = 4  # ops of one channel in flight at once, at most (they run in issue order)
_P2P_WINDOW = 16  # messages of one (src, dst) stream in flight at once (the replayer posts up to 8 sends ahead)
_PARTS = 16


def collective_tag_base(seq: int, part: int, n: int) -> int:
    return ((seq % _WINDOW) * _PARTS + part % _PARTS) * 2 * n * n


def p2p_tag_base(seq: int, part: int, n: int, src: int) -> int:
    """Tags of message ``seq`` (per-pair sequence) from group rank ``src``; the step adds ``dst``.
    Several (src, dst) streams of a group share its transport (one replayer endpoint hosts all
    vranks, and gloo matches by endpoint and tag), so the tag names the link, not only the seq."""
    return _P2P_BASE + (((seq % _P2P_WINDOW) * _PARTS + part % _PARTS) * n + src) * n


def p2p_tag(seq: int, part: int, n: int, src: int, dst: int) -> int:
    """The tag of the one message of send/recv ``seq`` (group ranks ``src`` -> ``dst``): what the
    pruned P2P step uses (:func:`p2p_tag_base` plus the step's tag), for a side that posts the
    message itself instead of running the step machine."""
    return _p2p_tag(seq % _P2P_WINDOW, part % _PARTS, n, src, dst)


@functools.lru_cache(maxsize=4096)  # once per message on the script's thread, where a Step costs more
def _p2p_tag(seq: int, part: int, n: int, src: int, dst: int) -> int:
    return p2p_tag_base(seq, part, n, src) + Step(0, src, dst, Phase.EXCHANGE, 0, 0).tag(n)


class WideTagTransport(Transport):
    """Gloo takes 31-bit tags; a ring over tens of thousands of ranks numbers its steps past that.
    Folding is safe because one link's messages of one collective are sent and received in step
    order, never two with the same folded tag at once."""

    def send(self, tensor: torch.Tensor, src: int, dst: int, tag: int):
        return super().send(tensor, src, dst, tag % _TAG_LIMIT)

    def recv(self, buffer: torch.Tensor, src: int, dst: int, tag: int):
        return super().recv(buffer, src, dst, tag % _TAG_LIMIT)



# ---------------------------------------------------------------------- the device data path
#
# On GPUs with the ``nccl`` layout (prism.core.layout), a sandbox rank's ops with vranks are
# *delegated*: the rank sends its inputs (the script's own device tensors) to the replayer of the
# group over a 2-endpoint NCCL communicator (a *lane*), the replayer runs the pruned collective
# there — this rank's real combine steps with the data it received, the neighbor vranks' recorded
# partials and compensation — and sends the rank's outputs back into the script's output tensors.
# Nothing of prism's is allocated through the sandbox's caching allocator (docs/virtual-ranks.md).


@dataclass(frozen=True, slots=True)
class Lane:
    """One ordered NCCL lane between a sandbox rank and a replayer: the collectives of a group
    (``src`` = ``dst`` = -1), or one (src, dst) message stream of a group."""

    group_id: str
    sandbox_rank: int
    src: int = -1
    dst: int = -1

    @property
    def prefix(self) -> str:
        if self.src < 0:
            return f"prism/lane/{self.group_id}/c/{self.sandbox_rank}"
        return f"prism/lane/{self.group_id}/p/{self.src}-{self.dst}"


def device_lanes(nodes: Iterable, rank: int, members: dict[str, Sequence[int]], sandbox: Iterable[int],
                 num_replayers: int) -> list[tuple[Lane, int]]:
    """The lanes sandbox rank ``rank`` opens (with the replayer index at their other end), in
    first-use order: one per group where it runs collectives with vranks, one per message stream
    with a vrank peer. ``nodes``: the rank's graph nodes; ``members``: group id -> global ranks.
    The replayer derives the same lanes from the same graph."""
    sandbox = frozenset(sandbox)
    out: dict[Lane, int] = {}
    for n in nodes:
        if n.kind not in (NodeKind.COLLECTIVE, NodeKind.SEND, NodeKind.RECV):
            continue
        if all(r in sandbox for r in members[n.group_id]):
            continue
        if n.kind is NodeKind.COLLECTIVE:
            lane = Lane(n.group_id, rank)
        elif n.kind in (NodeKind.SEND, NodeKind.RECV) and n.peer not in sandbox:
            src, dst = (rank, n.peer) if n.kind is NodeKind.SEND else (n.peer, rank)
            lane = Lane(n.group_id, rank, src, dst)
        else:
            continue
        out.setdefault(lane, replayer_of(n.group_id, num_replayers))
    return list(out.items())


def sends_input(op: CommOp, group_rank: int, root: int) -> bool:
    """Whether a sandbox rank's input travels to the replayer (a broadcast's or scatter's
    non-root and a barrier have nothing to contribute; a receiver of a message has no input)."""
    if op in (CommOp.BROADCAST, CommOp.SCATTER):
        return group_rank == root
    return op not in (CommOp.BARRIER, CommOp.RECV)


def receives_output(op: CommOp, group_rank: int, root: int) -> bool:
    """Whether the replayer sends the sandbox rank its output (a broadcast root, a reduce's or a
    gather's non-root and a sender of a message get none: their op completes when their input
    has left). A barrier's one-element output is its completion."""
    if op is CommOp.BROADCAST:
        return group_rank != root
    if op in (CommOp.REDUCE, CommOp.GATHER):
        return group_rank == root
    return op is not CommOp.SEND
