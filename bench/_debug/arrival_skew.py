"""Where a collective's time goes in a graph with a shared clock (a real run's): per (group, op,
position within the step), medians over the measured steps of the members' arrival spread (last
start minus first), the last arrival's span until its wait returned (the transfer proper, no
skew), and the members' mean blocked time (the collective's span plus its WAIT's). A real run
whose mean blocked time is far above its last arrival's span spends its comm time waiting for
late members, which a timed graph of typical (median) compute spans does not reproduce.

    python bench/_debug/arrival_skew.py --skip 2 RUN/graph/real
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from prism.graph.io import read_graph
from prism.graph.records import Graph, NodeKind


def instances(graph: Graph, skip: int) -> dict[tuple[str, str, int], list[dict[int, tuple[int, int, int]]]]:
    """(group, op, position in step) -> per measured step {rank: (start, blocked-until, blocked ns)}."""
    last = max((n.step for nodes in graph.nodes.values() for n in nodes), default=0)
    per: dict[tuple, dict[int, tuple[int, int, int]]] = defaultdict(dict)
    for rank, nodes in graph.nodes.items():
        waits = {n.target: n for n in nodes if n.kind is NodeKind.WAIT}
        position: dict[tuple[int, str], int] = defaultdict(int)
        for n in nodes:
            if n.kind is not NodeKind.COLLECTIVE or not skip <= n.step < last:
                continue
            k = (n.step, n.group_id)
            w = waits.get(n.index)
            end = max(n.end_ns, w.end_ns) if w is not None else n.end_ns
            blocked = n.duration_ns + (w.duration_ns if w is not None else 0)
            per[(n.group_id, n.op.value, position[k], n.step)][rank] = (n.start_ns, end, blocked)
            position[k] += 1
    out: dict[tuple, list] = defaultdict(list)
    for (group, op, pos, _), members in per.items():
        out[(group, op, pos)].append(members)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graph", help="a graph directory with a shared clock (RUN/graph/real)")
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    ns = p.parse_args()
    graph = read_graph(ns.graph)
    print(f"{'group op #':24s}{'spread':>10s}{'last span':>11s}{'blocked':>10s}   (ms, medians over steps)")
    totals = [0.0, 0.0, 0.0]
    for key, steps in sorted(instances(graph, ns.skip).items()):
        spread, last_span, blocked = [], [], []
        for members in steps:
            starts = [s for s, _, _ in members.values()]
            latest = max(members.values(), key=lambda m: m[0])
            spread.append((max(starts) - min(starts)) / 1e6)
            last_span.append((latest[1] - latest[0]) / 1e6)
            blocked.append(statistics.mean(b for _, _, b in members.values()) / 1e6)
        row = [statistics.median(v) for v in (spread, last_span, blocked)]
        totals = [t + r for t, r in zip(totals, row, strict=True)]
        print(f"{f'{key[0]} {key[1]} {key[2]}':24s}" + "".join(f"{r:10.3f} " for r in row))
    print(f"{'sum':24s}" + "".join(f"{t:10.3f} " for t in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
