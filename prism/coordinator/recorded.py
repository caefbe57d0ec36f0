"""Comm values from an earlier collection (paper §5.2, "user-defined communication input").

With ``comm_inputs: {source: recorded, run: OLD_RUN}`` no op waits for its peers: each comm op's
outputs are read from OLD_RUN/payloads (index.json) as soon as the rank submits it, so every rank
runs on its own and the ranks go through the K slots in rounds. OLD_RUN must have recorded the
outputs of every rank (``values.ranks`` covering all of them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from prism.core.errors import RunDirError
from prism.rpc import CommHeader

from .payloads import load_index, load_payload, op_key

__all__ = ["RecordedValues"]


def _needs_no_outputs(h: CommHeader) -> bool:
    if h.op in ("barrier", "send"):
        return True
    if h.op in ("reduce", "gather") and h.rank != h.root:
        return True
    return h.op == "broadcast" and h.rank == h.root


class RecordedValues:
    def __init__(self, run_dir: str | Path) -> None:
        self.directory = Path(run_dir) / "payloads"
        index = self.directory / "index.json"
        if not index.is_file():
            raise RunDirError(f"{run_dir}: no recorded payloads ({index} is missing); collect it with values.ranks "
                              "covering every rank first")
        self._index = load_index(self.directory)

    def outputs(self, h: CommHeader) -> list[torch.Tensor]:
        kind = "RECV" if h.op == "recv" else "COLLECTIVE"
        entry = self._index.get(op_key(h.rank, h.group_id, h.seq, kind), {})
        if "outputs" not in entry:
            if _needs_no_outputs(h):
                return []
            raise RunDirError(f"{self.directory}: no recorded outputs for rank {h.rank} {h.op} on group "
                              f"{h.group_id} seq {h.seq} (at {h.call_site or '?'}); was values.ranks all ranks?")
        return load_payload(self.directory, entry["outputs"])
