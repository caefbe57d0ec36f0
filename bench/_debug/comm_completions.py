"""When each collective of one step is issued and completes, in several graphs of one run.

For a rank and a step, every collective's issue and completion time from the step's start (the
sum of the compute spans before it, plus its recorded duration), in each graph directory given:
the real run's (``RUN/graph/real``) beside the calibrated one (``RUN/graph/timed``) shows where a
timed graph's step gets longer than the real one (docs/emulate.md: ddp's bucket all-reduces queue
in the calibration slice). Keep the run directories of a benchmark with ``--keep``.

    python bench/_debug/comm_completions.py --rank 2 --step 4 RUN/graph/real RUN/graph/timed
"""

from __future__ import annotations

import argparse
import sys

from prism.graph.io import read_graph
from prism.graph.records import NodeKind


def completions(graph_dir: str, rank: int, step: int) -> list[tuple[str, float, float]]:
    """(op, issued ms, completed ms) of each collective of ``rank``'s ``step``."""
    graph = read_graph(graph_dir)
    if rank not in graph.nodes:
        raise SystemExit(f"{graph_dir}: no rank {rank} (ranks {sorted(graph.nodes)})")
    t_ns, out = 0, []
    for n in graph.nodes[rank]:
        if n.step != step:
            continue
        if n.kind is NodeKind.COMPUTE:
            t_ns += max(0, n.duration_ns)
        elif n.kind is NodeKind.COLLECTIVE:
            out.append((f"{n.op.value} {n.size_bytes} B", t_ns / 1e6, (t_ns + max(0, n.duration_ns)) / 1e6))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graphs", nargs="+", help="graph directories")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--step", type=int, required=True)
    ns = p.parse_args()
    for g in ns.graphs:
        ops = completions(g, ns.rank, ns.step)
        gaps = [b[2] - a[2] for a, b in zip(ops, ops[1:], strict=False)]
        print(g)
        for op, issued, done in ops:
            print(f"  {op:28s} issued {issued:7.2f} ms  completed {done:7.2f} ms")
        if gaps:
            print("  completions apart: " + " ".join(f"{x:.2f}" for x in gaps) + " ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
