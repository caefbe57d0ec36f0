"""What collect stores for a later emulation of the ranks in ``values.ranks``.

For every resolved collective and message that touches those ranks, the recorded data the
pruned algorithms of ``prism.nccl_patches`` need (exact-order prefix partials, the sandbox
ranks' inputs and outputs), under RUN/payloads/pruned/<set>/ — computed here because only the
collector sees every rank's inputs. An emulation must use exactly this rank set.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError

from prism.nccl_patches.recorded_store import (
    record_for_values_ranks,
    record_p2p_for_values_ranks,
    recorded_dir,
    write_index,
)
from prism.rpc import CommHeader

from .executor import Arrival
from .payloads import write_error

__all__ = ["PrunedDataRecorder"]

log = logging.getLogger(__name__)


class PrunedDataRecorder:
    def __init__(self, run_dir: str | Path, values_ranks: Sequence[int], *, tree_all_reduce: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.tree_all_reduce = tree_all_reduce
        self.ranks = tuple(sorted(values_ranks))
        self._wanted = set(self.ranks)
        self.num_records = 0

    def collective(self, arrivals: Sequence[Arrival]) -> None:
        h0 = arrivals[0].header
        if h0.op == "barrier" or not self._wanted.intersection(h0.group_ranks):
            return
        inputs = [a.inputs for a in arrivals]
        full = next((x for x in inputs if x), None)
        if full is not None:
            # Ranks whose inputs the op ignores (broadcast/scatter non-roots) hand in none; any
            # filler of the right shape stands in for them.
            inputs = [x if x else [torch.zeros_like(t) for t in full] for x in inputs]
        try:
            record_for_values_ranks(
                self.run_dir, h0.group_id, h0.seq, h0.op, h0.reduce_op, h0.group_ranks,
                inputs, self.ranks, root=h0.root, flat=h0.flat,
                in_splits_by_group_rank=[list(a.header.in_splits) for a in arrivals],
                tree_all_reduce=self.tree_all_reduce,
            )
        except (OSError, SafetensorError) as e:
            raise write_error(recorded_dir(self.run_dir, self.ranks), e) from e
        self.num_records += 1

    def message(self, send: Arrival, recv: CommHeader) -> None:
        h = send.header
        if not self._wanted.intersection((h.rank, recv.rank)):
            return
        try:
            record_p2p_for_values_ranks(self.run_dir, h.group_id, h.group_ranks, h.rank, recv.rank, h.seq,
                                        send.inputs, self.ranks)
        except (OSError, SafetensorError) as e:
            raise write_error(recorded_dir(self.run_dir, self.ranks), e) from e
        self.num_records += 1

    def close(self) -> Path:
        directory = recorded_dir(self.run_dir, self.ranks)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            write_index(directory)
        except OSError as e:
            raise write_error(directory / "index.json", e) from e
        log.info("stored pruned-collective data of ranks %s: %d ops", self.ranks, self.num_records)
        return directory
