"""Chrome/Perfetto trace JSON of a graph (``chrome://tracing``, ui.perfetto.dev).

One process per rank (pid = rank), one thread per lane: tid 0 is the compute lane, comm nodes go
on one thread per process group (P2P on the group's thread too). Times come from the nodes'
``start_ns``/``duration_ns`` (a recording, or a timed graph), or from a simulation's timelines.
"""

from __future__ import annotations

import json
from pathlib import Path

from prism.core.atomic import atomic_write_text

from .records import Graph, NodeKind
from .simulate import SimResult
from .text import format_node

__all__ = ["to_chrome_trace", "write_chrome_trace"]


def _lane(group_id: str, lanes: dict[str, int]) -> int:
    if group_id not in lanes:
        lanes[group_id] = len(lanes) + 1
    return lanes[group_id]


def to_chrome_trace(graph: Graph, sim: SimResult | None = None, *, label: str = "") -> dict:
    """The trace as a dict (``traceEvents`` + metadata). With ``sim``, its predicted times are used."""
    events: list[dict] = []
    lanes: dict[str, int] = {}
    for rank, nodes in sorted(graph.nodes.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}{label}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "compute"}})
        timeline = sim.ranks.get(rank) if sim else None
        named: set[int] = set()
        for i, n in enumerate(nodes):
            if timeline is not None:
                start, end = timeline.start_ns[i], timeline.end_ns[i]
            else:
                start, end = n.start_ns, n.end_ns
            if n.kind is NodeKind.MARK and start >= 0:
                events.append({"ph": "i", "s": "p", "name": n.mark or "mark", "pid": rank, "tid": 0,
                               "ts": start / 1e3, "args": {"step": n.step}})
                continue
            if start < 0 or end < 0 or n.kind is NodeKind.MARK:
                continue
            if n.kind is NodeKind.COMPUTE:
                tid, name = 0, "compute"
            elif n.kind is NodeKind.WAIT:
                tid, name = 0, "wait"
            else:
                tid = _lane(n.group_id, lanes)
                name = n.op.value if n.op else n.kind.value.lower()
                if tid not in named:
                    desc = graph.groups[n.group_id].desc if n.group_id in graph.groups else ""
                    events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                                   "args": {"name": f"comm g{n.group_id} {desc}".strip()}})
                    named.add(tid)
            events.append({"ph": "X", "name": name, "pid": rank, "tid": tid, "ts": start / 1e3,
                           "dur": max(0, end - start) / 1e3, "args": {"node": format_node(n), "step": n.step}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"job": graph.job_name, "graph": graph.kind, "world_size": graph.world_size}}


def write_chrome_trace(path: str | Path, trace: dict) -> None:
    atomic_write_text(path, json.dumps(trace))
