"""Which compute spans of a rank a timed graph makes shorter or longer than the real run: per span
(its place in the step and the comm op before it), the median duration over the measured steps in
each graph, largest differences first. For a calibration whose compute misses the real run's
(hybrid-sleep's rank 2 on 16 cores, session 30: 211.6 ms per step in its slice against 225.5 real).
Keep the run directories of a benchmark with ``--keep``.

    python bench/_debug/compute_spans.py --rank 2 --skip 2 RUN/graph/real RUN/graph/timed [--top 20]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from prism.graph.io import read_graph
from prism.graph.records import Graph, NodeKind


def span_medians(graph: Graph, rank: int, skip: int) -> dict[tuple[int, str], float]:
    """(index of the compute span in its step, the comm op before it) -> median ms over the steps
    from ``skip`` on, the last (possibly cut) step left out."""
    nodes_of_rank = graph.nodes[rank]
    steps = defaultdict(list)
    for n in nodes_of_rank:
        if n.step >= skip:
            steps[n.step].append(n)
    durations = defaultdict(list)
    for _, nodes in sorted(steps.items())[:-1]:
        k, before = 0, "step start"
        for n in nodes:
            if n.kind is NodeKind.COMPUTE:
                durations[(k, before)].append(n.duration_ns / 1e6)
                k += 1
            elif n.kind is not NodeKind.MARK:
                op = nodes_of_rank[n.target] if n.kind is NodeKind.WAIT and n.target >= 0 else n
                before = f"{n.kind.value} {op.op.value if op.op else ''} {op.call_site}".strip()
    return {key: statistics.median(v) for key, v in durations.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("real")
    p.add_argument("timed")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    p.add_argument("--top", type=int, default=20)
    ns = p.parse_args()
    real = span_medians(read_graph(ns.real), ns.rank, ns.skip)
    timed = span_medians(read_graph(ns.timed), ns.rank, ns.skip)
    print(f"rank {ns.rank}: compute per step {sum(real.values()):.1f} ms real, {sum(timed.values()):.1f} ms timed")
    keys = sorted(set(real) | set(timed), key=lambda k: -abs(timed.get(k, 0.0) - real.get(k, 0.0)))
    for k in keys[:ns.top]:
        r, t = real.get(k, 0.0), timed.get(k, 0.0)
        print(f"span {k[0]:3d} after {k[1][:60]:60s} real {r:7.2f}  timed {t:7.2f}  {t - r:+6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
