"""A Gantt chart of one step: one row per rank and lane (compute, each comm stream), so the
pipeline bubble and the straggler show without a trace viewer."""

from __future__ import annotations

import logging
import io
from pathlib import Path

from prism.core.atomic import atomic_write_bytes
from prism.graph.lanes import COMPUTE_LANE, lane_spans
from prism.graph.records import Graph, NodeKind

__all__ = ["write_gantt", "MAX_RANKS"]

log = logging.getLogger(__name__)

MAX_RANKS = 16
"""Ranks drawn at most (the first ones); a chart of thousands of rows shows nothing."""

_COLORS = {NodeKind.COMPUTE: "#4C72B0", NodeKind.WAIT: "#BBBBBB", NodeKind.COLLECTIVE: "#DD8452",
           NodeKind.SEND: "#55A868", NodeKind.RECV: "#8172B3"}


def write_gantt(graph: Graph, step: int, path: str | Path, *, title: str = "", t_lb_ns: int | None = None,
                highlight: frozenset[tuple[int, int]] = frozenset()) -> Path:
    """Draw ``step`` of ``graph`` (observed times) into the PNG ``path``; returns the path.
    ``highlight``: (rank, index) of nodes outlined in red (the binding chain)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(graph.nodes)[:MAX_RANKS]
    rows: list[tuple[int, str]] = []
    bars: dict[tuple[int, str], list] = {}
    origin = None
    for r in ranks:
        nodes = [n for n in graph.nodes[r] if max(n.step, 0) == step]
        spans = list(lane_spans(nodes))
        lanes = [COMPUTE_LANE] + sorted({s.lane for s in spans} - {COMPUTE_LANE})
        for lane in lanes:
            rows.append((r, lane))
        for s in spans:
            bars.setdefault((r, s.lane), []).append(s)
            origin = s.start_ns if origin is None else min(origin, s.start_ns)
    origin = origin or 0
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.28 * len(rows) + 1.2)))
    for y, key in enumerate(rows):
        for kind in _COLORS:
            xs = [((s.start_ns - origin) / 1e6, max((s.end_ns - s.start_ns) / 1e6, 1e-3))
                  for s in bars.get(key, ()) if s.node.kind is kind]
            if xs:
                ax.broken_barh(xs, (y - 0.4, 0.8), facecolors=_COLORS[kind], linewidth=0)
        marked = [((s.start_ns - origin) / 1e6, max((s.end_ns - s.start_ns) / 1e6, 1e-3))
                  for s in bars.get(key, ()) if (s.node.rank, s.node.index) in highlight]
        if marked:
            ax.broken_barh(marked, (y - 0.45, 0.9), facecolors="none", edgecolors="red", linewidth=1.2)
    ax.set_yticks(range(len(rows)), [f"r{r} {lane}" for r, lane in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's first event")
    if t_lb_ns is not None:
        ax.axvline(t_lb_ns / 1e6, color="red", linestyle="--", linewidth=1)
    handles = [Patch(color=c, label=k.value.lower()) for k, c in _COLORS.items()]
    if t_lb_ns is not None:
        handles.append(Patch(color="red", label="T_lb"))
    if highlight:
        handles.append(Patch(facecolor="none", edgecolor="red", label="binding chain"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    hidden = len(graph.nodes) - len(ranks)
    shown = f" (first {len(ranks)} ranks of {len(graph.nodes)})" if hidden else ""
    ax.set_title((title or f"{graph.job_name} step {step}") + shown, fontsize=9, loc="left")
    fig.tight_layout()


    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
