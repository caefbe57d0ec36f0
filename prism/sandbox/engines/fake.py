"""The ``fake`` engine: deterministic filler values, immediate completion.

The cheapest way to walk one rank's distributed path alone, like PyTorch's built-in fake
process group, but with values that keep simple programs sane: an all-gather repeats this rank's
input, a reduce-scatter returns this rank's own chunk, reductions leave the input as it is, and
data that only another rank could provide (broadcast/scatter from another root, recv, uneven
all-to-all) is zeros. Programs whose control flow depends on received values (MoE split sizes,
``broadcast_object_list``) do not follow the real path under this engine; that is what the
``coordinator`` and ``recorded`` engines are for.
"""

from __future__ import annotations

import torch

from prism.graph.records import CommOp

from .base import CommEngine, CommRequest

__all__ = ["FakeEngine"]


def _fill(req: CommRequest) -> None:
    op, group = req.op, req.group
    me = group.group_rank
    if op in (CommOp.ALL_REDUCE, CommOp.REDUCE, CommOp.BARRIER, CommOp.SEND):
        return
    if op is CommOp.ALL_GATHER:
        if req.flat:
            for out, inp in zip(req.outputs, req.inputs, strict=True):
                out.view(group.size, -1).copy_(inp.reshape(1, -1).expand(group.size, -1))
        else:
            for out in req.outputs:
                out.copy_(req.inputs[0])
        return
    if op is CommOp.REDUCE_SCATTER:
        if req.flat:
            for out, inp in zip(req.outputs, req.inputs, strict=True):
                out.copy_(inp.reshape(group.size, -1)[me].view_as(out))
        else:
            req.outputs[0].copy_(req.inputs[me])
        return
    if op is CommOp.ALL_TO_ALL:
        if req.flat:
            even = not req.in_splits and not req.out_splits
            if even or req.in_splits == req.out_splits:
                req.outputs[0].copy_(req.inputs[0])
            else:
                req.outputs[0].zero_()
        else:
            for out, inp in zip(req.outputs, req.inputs, strict=True):
                out.copy_(inp) if out.shape == inp.shape else out.zero_()
        return
    if op is CommOp.BROADCAST:
        return  # every rank keeps its own values: identical programs agree (DDP's checks pass)
    if op is CommOp.GATHER:
        for out in req.outputs:
            out.copy_(req.inputs[0])
        return
    if op is CommOp.SCATTER:
        if req.root == group.global_rank:
            req.outputs[0].copy_(req.inputs[me])
        else:
            req.outputs[0].zero_()
        return
    if op is CommOp.RECV:
        # Ones, not zeros: a received flag or vote reads "yes" (pipelining's static-shape vote is
        # a product of ones), a received count is small and non-zero.
        for t in req.outputs:
            t.fill_(1)
        return
    raise AssertionError(f"unhandled op {op}")


class FakeEngine(CommEngine):
    name = "fake"

    def submit(self, request: CommRequest) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        with torch.no_grad():
            _fill(request)
        future.set_result(request.outputs)
        return future
