"""Read the rank workers' records and assemble the bare graph.

Each worker pickles what its recorder saw (the same recorder ``prism record`` uses, so node
kinds and metadata are identical) at exit, as a :class:`prism.graph.records.RankRecord`.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path

from prism.core.config import JobConfig
from prism.core.errors import RunDirError
from prism.core.workerspec import record_path
from prism.graph.records import Graph, Node, NodeKind, RankRecord, merge_groups

from .payloads import PayloadStore, op_key

__all__ = ["read_record", "assemble_bare_graph"]


def read_record(out_dir: str | Path, rank: int) -> RankRecord:
    path = record_path(out_dir, rank)
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # noqa: S301 - our own worker's output
    except FileNotFoundError as e:
        raise RunDirError(f"rank {rank} left no record at {path}") from e


def _with_payloads(rec: RankRecord, store: PayloadStore | None) -> tuple[Node, ...]:
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


def assemble_bare_graph(job: JobConfig, records: Sequence[RankRecord], *, store: PayloadStore | None,
                        meta: dict[str, str]) -> Graph:
    groups = merge_groups(records)
    return Graph(
        world_size=job.world_size,
        nodes={rec.rank: _with_payloads(rec, store) for rec in records},
        groups=groups,
        summaries={rec.rank: rec.summary for rec in records},
        kind="bare",
        job_name=job.name,
        meta={"engine": "coordinator", **meta},
    )
