"""``prism record --payloads``: keep every tensor a rank received, beside the real run.

Wraps the engine of a real run (``passthrough``): when an op completes, its outputs are stored in
``RUN/payloads_real/rank-R/`` (content-addressed safetensors and an ``index.json`` keyed
``"<rank>/<group_id>/<seq>/<kind>"``, the format of a collection's payloads), which is what
``prism replay --values`` restores. The copy is taken on the thread that completes the op, before
the script sees the result, so it is the value the script received.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from prism.graph.payloads import PayloadStore, op_key
from prism.graph.records import CommOp

from ..memtrack import untracked
from .base import CommEngine, CommRequest, GroupHandle

__all__ = ["PayloadTap"]

log = logging.getLogger(__name__)


class PayloadTap(CommEngine):
    def __init__(self, inner: CommEngine, directory: str | Path, rank: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.rank = rank
        self.store = PayloadStore(directory)

    def create_group(self, group: GroupHandle, store: object) -> None:
        self.inner.create_group(group, store)

    def submit(self, request: CommRequest) -> torch.futures.Future:
        future = self.inner.submit(request)
        if request.op is CommOp.SEND or not request.outputs:
            return future
        kind = "RECV" if request.op is CommOp.RECV else "COLLECTIVE"
        key = op_key(self.rank, request.group.group_id, request.seq, kind)
        store = self.store

        def keep(f: torch.futures.Future):
            outputs = f.value()
            with untracked():  # host copies: the store hashes and writes host memory
                store.note(key, "outputs", store.put([t.detach().cpu() for t in outputs]))
            return outputs

        return future.then(keep)

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        finally:
            self.store.write_index()
            log.info("rank %d: %d payloads recorded (%d bytes) in %s", self.rank, len(self.store.index),
                     self.store.num_bytes_written, self.store.directory)
