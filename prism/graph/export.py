"""Chrome/Perfetto trace JSON of a graph (``chrome://tracing``, ui.perfetto.dev).

One process per rank (pid = rank), one thread per lane (:mod:`prism.graph.lanes`): tid 0 is the
compute lane (compute and waits), then one tid per comm stream — a group's collectives, the
messages to one peer, the messages from one peer. Spans on a lane never overlap, so slices nest
correctly per (pid, tid). Flow arrows join each SEND to its RECV, and the members of each
collective instance (``g<group>:<seq>``) in rank order. Times come from the nodes'
``start_ns``/``duration_ns`` (a recording, a timed graph, an emulation), or from a simulation's
timelines.
"""

from __future__ import annotations

import json
from pathlib import Path

from prism.core.atomic import atomic_write_text

from .lanes import COMPUTE_LANE, Span, lane_spans
from .records import Graph, NodeKind
from .simulate import SimResult
from .text import format_node

__all__ = ["to_chrome_trace", "write_chrome_trace"]


def _us(ns: int) -> float:
    return ns / 1e3


def to_chrome_trace(graph: Graph, sim: SimResult | None = None, *, label: str = "") -> dict:
    """The trace as a dict (``traceEvents`` + metadata). With ``sim``, its predicted times are used."""
    events: list[dict] = []
    sends: dict[tuple, Span] = {}
    recvs: dict[tuple, Span] = {}
    instances: dict[tuple[str, int], list[Span]] = {}
    lane_tids: dict[int, dict[str, int]] = {}
    for rank, nodes in sorted(graph.nodes.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}{label}"}})
        tids = {COMPUTE_LANE: 0}
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": COMPUTE_LANE}})
        timeline = sim.ranks.get(rank) if sim else None
        times = list(zip(timeline.start_ns, timeline.end_ns)) if timeline is not None else None
        for i, n in enumerate(nodes):
            start = times[i][0] if times is not None else n.start_ns
            if n.kind is NodeKind.MARK and start >= 0:
                events.append({"ph": "i", "s": "p", "name": n.mark or "mark", "pid": rank, "tid": 0,
                               "ts": _us(start), "args": {"step": n.step}})
        for span in lane_spans(nodes, times):
            n = span.node
            if span.lane not in tids:
                tids[span.lane] = len(tids)
                desc = graph.groups[n.group_id].desc if n.group_id in graph.groups else ""
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[span.lane],
                               "args": {"name": f"comm {span.lane} {desc}".strip()}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tids[span.lane],
                               "args": {"sort_index": tids[span.lane]}})
            name = n.op.value if n.op else n.kind.value.lower()
            args = {"node": format_node(n), "step": n.step}
            if n.kind is NodeKind.COLLECTIVE:
                args["instance"] = f"g{n.group_id}:{n.seq}"
                instances.setdefault((n.group_id, n.seq), []).append(span)
            elif n.kind is NodeKind.SEND:
                sends[(rank, n.peer, n.group_id, n.seq)] = span
            elif n.kind is NodeKind.RECV:
                recvs[(n.peer, rank, n.group_id, n.seq)] = span
            events.append({"ph": "X", "name": name, "pid": rank, "tid": tids[span.lane], "ts": _us(span.start_ns),
                           "dur": _us(span.end_ns - span.start_ns), "args": args})
        lane_tids[rank] = tids
    events += _flows(lane_tids, sends, recvs, instances)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"job": graph.job_name, "graph": graph.kind, "world_size": graph.world_size}}


def _flow(tids: dict[int, dict[str, int]], ph: str, fid: int, span: Span, cat: str, name: str) -> dict:
    # A flow event binds to the slice that encloses its timestamp on its (pid, tid): the span's start.
    ev = {"ph": ph, "id": fid, "cat": cat, "name": name, "pid": span.node.rank,
          "tid": tids[span.node.rank][span.lane], "ts": _us(span.start_ns)}
    if ph != "s":
        ev["bp"] = "e"
    return ev


def _flows(tids: dict[int, dict[str, int]], sends: dict, recvs: dict, instances: dict) -> list[dict]:
    events: list[dict] = []
    fid = 0
    for key, send in sorted(sends.items()):
        recv = recvs.get(key)
        if recv is None:
            continue
        fid += 1
        events.append(_flow(tids, "s", fid, send, "p2p", f"r{key[0]}→r{key[1]} g{key[2]}:{key[3]}"))
        events.append(_flow(tids, "f", fid, recv, "p2p", f"r{key[0]}→r{key[1]} g{key[2]}:{key[3]}"))
    for (gid, seq), spans in sorted(instances.items()):
        if len(spans) < 2:
            continue
        fid += 1
        ordered = sorted(spans, key=lambda s: s.node.rank)
        name = f"g{gid}:{seq}"
        events.append(_flow(tids, "s", fid, ordered[0], "collective", name))
        events += [_flow(tids, "t", fid, s, "collective", name) for s in ordered[1:-1]]
        events.append(_flow(tids, "f", fid, ordered[-1], "collective", name))
    return events


def write_chrome_trace(path: str | Path, trace: dict) -> None:
    atomic_write_text(path, json.dumps(trace))
