"""A collective of a group of two with one sandbox rank and one vrank, run as one exchange.

On the host path a 2-rank all-reduce is two ring steps, each driven in Python on the sandbox rank's
channel thread. That thread shares the GIL with the script's thread, which runs DTensor's and the
functional collectives' Python from its issue to its wait: on 16 cores tp-sleep's TP all-reduce
started its ring 0.7-0.8 ms after its issue and completed 1.1-1.3 ms after the later issue, against
0.47-0.52 ms in the real runs, where gloo runs it in C++ (docs/emulate.md, "A 2-rank collective
with a vrank partner"). Here each side instead posts one send and one receive over the group's
transport (gloo, C++) at its issue, as a message is posted, and the sandbox's result is built when
the script waits for it:

* all-reduce: each side sends its whole input (the ring's two steps carry as many bytes);
* all-gather: each side sends its shard;
* reduce-scatter: each side sends the other's chunk of its input.

The vrank sends what the collector recorded: its whole input for an all-reduce (``partner_inputs``),
its chunk for a reduce-scatter (the entry partial), its shard for an all-gather (part of the
sandbox's recorded output). The sandbox rank reduces its own input and what the vrank sent in prism's
ring order (:mod:`.reduction`, one op for the two operands: :func:`~.reduction.reduce_two`): the
collector's value bit for bit when its input is the recorded one, and the value the collector would
have computed for a changed input (the op is then flagged diverged, as on the ring).

Both sides decide from what each knows without talking (:func:`runs_as_pair`): the op, the reduce op
and the group's membership. ``PRISM_PAIR_EXCHANGE=0`` in the environment of ``prism emulate`` (read by
the sandbox ranks and the replayers alike) keeps the ring, to compare.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

import torch

from prism.core.errors import PrismError
from prism.graph.records import CommOp

from .compensation import RecordedCollective
from .reduction import chunk_bounds, reduce_two

__all__ = ["PAIR_OPS", "enabled", "runs_as_pair", "pair_tag", "sandbox_sends", "sandbox_receive_numel", "vrank_sends",
           "vrank_receive_numel", "pair_result"]

PAIR_OPS = frozenset({CommOp.ALL_REDUCE, CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER})

_PAIR_BASE = 2**29
"""Between a group of two's ring tags (below 2·n²·64 = 512, :func:`~.vplan.collective_tag_base`) and
its message tags (from 2**30, :func:`~.vplan.p2p_tag_base`)."""
_PAIR_WINDOW = 16
_PARTS = 16


def enabled() -> bool:
    """Read once by each sandbox rank and replayer (both sides must take the same path)."""
    return os.environ.get("PRISM_PAIR_EXCHANGE", "1") != "0"


def runs_as_pair(op: CommOp | None, reduce_op: str, group_ranks: Sequence[int], sandbox: Collection[int]) -> bool:
    """Whether the op runs as one exchange (where :func:`enabled`): an all-reduce, all-gather or
    reduce-scatter of a group of two with one sandbox member (``premul_sum``'s factors stay on the
    ring)."""
    return (op in PAIR_OPS and len(group_ranks) == 2 and sum(r in sandbox for r in group_ranks) == 1
            and reduce_op != "premul_sum")


def pair_tag(seq: int, part: int, src: int) -> int:
    """The tag of the message group rank ``src`` sends in part ``part`` of op ``seq``. Ops of a
    group are posted in issue order by both sides, and gloo matches a tag's messages in order, so
    ops further apart than the window may share tags."""
    return _PAIR_BASE + ((seq % _PAIR_WINDOW) * _PARTS + part % _PARTS) * 2 + src


def _other(me: int) -> int:
    return 1 - me


def sandbox_sends(op: CommOp, data: torch.Tensor, me: int) -> torch.Tensor:
    """What sandbox group rank ``me`` sends, from its flat part ``data``."""
    if op is CommOp.REDUCE_SCATTER:
        lo, hi = chunk_bounds(data.numel(), 2)[_other(me)]
        return data[lo:hi]
    return data


def sandbox_receive_numel(op: CommOp, numel: int, me: int) -> int:
    """Elements the sandbox rank receives, for its flat part of ``numel`` elements."""
    if op is CommOp.REDUCE_SCATTER:
        lo, hi = chunk_bounds(numel, 2)[me]
        return hi - lo
    return numel


def vrank_sends(op: CommOp, rec: RecordedCollective, what: str) -> torch.Tensor:
    """What the vrank sends to the record's one sandbox rank; ``what`` names the op in an error."""
    (s,) = rec.sandbox
    v = _other(s)
    if op is CommOp.ALL_REDUCE:
        if s not in rec.partner_inputs:
            raise PrismError(f"{what}: the recorded data predates the vrank's whole input, which a group "
                             "of two now sends in one exchange: collect the run again (or set "
                             "PRISM_PAIR_EXCHANGE=0 to run it as a ring)")
        return rec.partner_inputs[s]
    if op is CommOp.ALL_GATHER:
        full = rec.outputs[s]
        lo, hi = chunk_bounds(full.numel(), 2)[v]
        return full[lo:hi]
    if op is CommOp.REDUCE_SCATTER:
        entry = rec.entry_partials[s]
        lo, hi = chunk_bounds(entry.numel(), 2)[s]
        return entry[lo:hi]
    raise PrismError(f"{what}: {op.value} does not run as a pair")


def vrank_receive_numel(op: CommOp, rec: RecordedCollective) -> int:
    """Elements the vrank receives from the record's sandbox rank."""
    (s,) = rec.sandbox
    if op is CommOp.ALL_GATHER:
        return rec.inputs[s].numel()
    if op is CommOp.REDUCE_SCATTER:
        lo, hi = chunk_bounds(rec.inputs[s].numel(), 2)[_other(s)]
        return hi - lo
    return rec.inputs[s].numel()


def pair_result(op: CommOp, reduce_op: str, me: int, data: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
    """Sandbox group rank ``me``'s flat result, from its flat part ``data`` and what the vrank sent,
    in prism's ring order (:mod:`.reduction`): the collector's value, bit for bit, for these inputs.
    An all-reduce's result is written over ``data`` (the input's flat view, or its copy: the op's
    result buffer, as on the ring)."""
    if op is CommOp.ALL_GATHER:
        return torch.cat([data, received] if me == 0 else [received, data])
    if op is CommOp.ALL_REDUCE:
        return reduce_two(data, received, reduce_op, out=data)
    if op is CommOp.REDUCE_SCATTER:
        lo, hi = chunk_bounds(data.numel(), 2)[me]
        return reduce_two(data[lo:hi], received, reduce_op)
    raise AssertionError(f"{op.value} does not run as a pair")
