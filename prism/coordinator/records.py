"""Read the rank workers' records and assemble the bare graph.

Each worker pickles what its recorder saw (the same recorder ``prism record`` uses, so node
kinds and metadata are identical) at exit. The record class lives in the sandbox, which the
coordinator must not import; the unpickler maps it to :class:`WorkerRecord` with the same fields.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path

from prism.core.config import JobConfig
from prism.core.errors import RunDirError
from prism.core.workerspec import record_path
from prism.graph.records import Graph, GroupInfo, Node, NodeKind, RankSummary

from .payloads import PayloadStore, op_key

__all__ = ["WorkerRecord", "read_record", "assemble_bare_graph"]

_SANDBOX_RECORD = ("prism.sandbox.recorder", "RankRecord")


@dataclasses.dataclass
class WorkerRecord:
    rank: int
    world_size: int
    nodes: list[Node]
    groups: list[GroupInfo]
    summary: RankSummary
    engine: str


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == _SANDBOX_RECORD:
            return WorkerRecord
        if module.startswith(("prism.graph.", "builtins", "collections", "copyreg", "enum")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected class {module}.{name} in a rank record")


def read_record(out_dir: str | Path, rank: int) -> WorkerRecord:
    path = record_path(out_dir, rank)
    try:
        with open(path, "rb") as f:
            return _Unpickler(f).load()
    except FileNotFoundError as e:
        raise RunDirError(f"rank {rank} left no record at {path}") from e


def _with_payloads(rec: WorkerRecord, store: PayloadStore | None) -> tuple[Node, ...]:
    if store is None or not store.index:
        return tuple(rec.nodes)
    out = []
    for n in rec.nodes:
        if n.kind in (NodeKind.COLLECTIVE, NodeKind.RECV):
            entry = store.index.get(op_key(rec.rank, n.group_id, n.seq, n.kind.value))
            if entry and "outputs" in entry:
                n = dataclasses.replace(n, payload=entry["outputs"])
        out.append(n)
    return tuple(out)


def assemble_bare_graph(job: JobConfig, records: Sequence[WorkerRecord], *, store: PayloadStore | None,
                        meta: dict[str, str]) -> Graph:
    groups: dict[str, GroupInfo] = {}
    for rec in records:
        for g in rec.groups:
            known = groups.get(g.group_id)
            if known is None or (not known.desc and g.desc):
                groups[g.group_id] = g
    return Graph(
        world_size=job.world_size,
        nodes={rec.rank: _with_payloads(rec, store) for rec in records},
        groups=groups,
        summaries={rec.rank: rec.summary for rec in records},
        kind="bare",
        job_name=job.name,
        meta={"engine": "coordinator", **meta},
    )
