"""Each collective's transfer time, a real run's graph beside a timed one: per (group, op, position
within the step), the median over the measured steps of the instance's shortest member duration
(the last member to arrive waits least, so its span is closest to the pure transfer: the rule of
:mod:`prism.graph.simulate`). A timed graph whose small collectives take longer than the real run's
carries the calibration slices' own cost per op (session 18: moe-sleep's all-to-alls 0.9–1.9 ms
timed against 0.3–0.6 ms real).

    python bench/_debug/transfer_times.py --skip 2 RUN/graph/real RUN/graph/timed [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

from prism.graph.io import read_graph
from prism.graph.records import Graph, NodeKind


def transfers(graph: Graph, skip: int) -> dict[tuple[str, str, int], float]:
    """(group, op, position in step) -> median ms over the measured steps (after ``skip``; the last
    step left out: it may be cut short) of the instance's shortest member duration."""
    per_instance: dict[tuple, list[float]] = defaultdict(list)
    last = max((n.step for nodes in graph.nodes.values() for n in nodes), default=0)
    for nodes in graph.nodes.values():
        position: dict[tuple[int, str], int] = defaultdict(int)
        for n in nodes:
            if n.kind is not NodeKind.COLLECTIVE or not skip <= n.step < last:
                continue
            k = (n.step, n.group_id)
            per_instance[(n.group_id, n.op.value, position[k], n.step)].append(n.duration_ns / 1e6)
            position[k] += 1
    by_key: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for (group, op, pos, _), durations in per_instance.items():
        by_key[(group, op, pos)].append(min(durations))
    return {k: statistics.median(v) for k, v in by_key.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graphs", nargs="+", help="graph directories (e.g. RUN/graph/real RUN/graph/timed)")
    p.add_argument("--skip", type=int, default=1, help="warm-up steps left out")
    p.add_argument("--json", help="also write the table here")
    ns = p.parse_args()
    tables = {g: transfers(read_graph(g), ns.skip) for g in ns.graphs}
    keys = sorted({k for t in tables.values() for k in t})
    print(f"{'group op #':28s}" + "".join(f"{g[-22:]:>24s}" for g in tables))
    for k in keys:
        print(f"{f'{k[0]} {k[1]} {k[2]}':28s}" + "".join(f"{t.get(k, float('nan')):24.3f}" for t in tables.values()))
    print(f"{'sum':28s}" + "".join(f"{sum(t.values()):24.3f}" for t in tables.values()))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({g: {" ".join(map(str, k)): round(v, 4) for k, v in t.items()} for g, t in tables.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
