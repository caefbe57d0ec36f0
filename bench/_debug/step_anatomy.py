"""Where a rank's step goes, in several graphs of one run: compute, and the time blocked on each
kind of comm op (by the op and its group), medians over the measured steps.

A rank's step is its compute spans plus the time it is blocked on comm (an async op's WAIT, a
synchronous op's span), so the rows add up to the step. The real run's graph (``RUN/graph/real``) beside the calibrated one
(``RUN/graph/timed``) shows which waits a timed graph makes longer than the real run (session 16:
hybrid's calibrated "rest" 72–84 ms against 52–56 ms real). Keep the run directories of a
benchmark with ``--keep``.

    python bench/_debug/step_anatomy.py --ranks 2,5 --skip 2 RUN/graph/real RUN/graph/timed [--json OUT]
    python bench/_debug/step_anatomy.py --ranks 2,5 --skip 2 RUN/graph/timed RUN/emulations/<id>

A directory without a graph manifest is read as an emulation's (``load_emulation``): beside the
run's timed graph it shows what the emulation adds to its own timed graph, per kind of wait.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from prism.graph.io import read_graph
from prism.graph.records import Graph, NodeKind
from prism.vrank_replayer.emulate_report import load_emulation


def read_graph_or_emulation(path: str) -> Graph:
    """A graph directory, or an emulation's (RUN/emulations/<id>: its sandbox ranks' own nodes)."""
    return read_graph(path) if (Path(path) / "manifest.pb").is_file() else load_emulation(path)


def _label(graph: Graph, node) -> str:
    members = graph.groups[node.group_id].ranks if node.group_id in graph.groups else ()
    who = f"peer {node.peer}" if node.kind in (NodeKind.SEND, NodeKind.RECV) else f"group {list(members)}"
    return f"{'wait' if node.is_async else 'sync'} {node.op.value if node.op else node.kind.value} {who}"


def anatomy(graph: Graph, rank: int, skip: int) -> dict[str, float]:
    """Median ms per measured step (steps after ``skip``) of compute and of the time blocked on each
    kind of comm op: an asynchronous op's WAIT; a synchronous op's own span or its WAIT, whichever is
    longer (a recording has both, the WAIT inside the op's span; a timed graph's synchronous op
    blocks the rank for its span and its WAIT takes no time)."""
    nodes = graph.nodes[rank]
    waited = defaultdict(float)
    for n in nodes:
        if n.kind is NodeKind.WAIT and 0 <= n.target < len(nodes) and n.duration_ns > 0:
            waited[n.target] += n.duration_ns / 1e6
    per_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for i, n in enumerate(nodes):
        if n.step < skip or n.duration_ns < 0:
            continue
        if n.kind is NodeKind.COMPUTE:
            per_step[n.step]["compute"] += n.duration_ns / 1e6
        elif n.is_comm:
            blocked = waited.get(i, 0.0) if n.is_async else max(waited.get(i, 0.0), n.duration_ns / 1e6)
            per_step[n.step][_label(graph, n)] += blocked
    steps = sorted(per_step)[:-1] if len(per_step) > 1 else sorted(per_step)  # the last may be cut short
    keys = sorted({k for s in steps for k in per_step[s]})
    return {k: round(statistics.median(per_step[s].get(k, 0.0) for s in steps), 3) for k in keys}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graphs", nargs="+", help="graph directories (e.g. RUN/graph/real RUN/graph/timed)")
    p.add_argument("--ranks", required=True, help="comma-separated ranks")
    p.add_argument("--skip", type=int, default=1, help="warm-up steps left out")
    p.add_argument("--json", help="also write the table here")
    ns = p.parse_args()
    ranks = [int(r) for r in ns.ranks.split(",")]
    graphs = {g: read_graph_or_emulation(g) for g in ns.graphs}
    table = {}
    for rank in ranks:
        rows = {g: anatomy(graph, rank, ns.skip) for g, graph in graphs.items() if rank in graph.nodes}
        keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k != "compute", k))
        print(f"rank {rank}: ms per step, median over steps >= {ns.skip}")
        print("  " + f"{'':44s}" + "".join(f"{g[-24:]:>26s}" for g in rows))
        for k in keys:
            print("  " + f"{k[:44]:44s}" + "".join(f"{rows[g].get(k, 0.0):26.2f}" for g in rows))
        print("  " + f"{'sum':44s}" + "".join(f"{sum(rows[g].values()):26.2f}" for g in rows))
        table[str(rank)] = rows
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
