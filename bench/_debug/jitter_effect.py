"""How much of a real run's step the ranks' step-to-step jitter makes: the discrete-event pass of
:mod:`prism.graph.simulate` on the real run's graph as recorded (each rank's own spans, step by
step), and on the same graph with every rank's nodes taking their median over the steady steps
(:func:`prism.calibration.typical_steps`, what a timed graph holds). Where the first matches the
real run and the second is shorter, the real run's comm time is members waiting for whichever
of them was late this step, which a graph of typical spans does not have.

    python bench/_debug/jitter_effect.py --skip 2 RUN/graph/real
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from prism.calibration import typical_steps
from prism.graph.io import read_graph
from prism.graph.simulate import compare_steps, simulate


def _median_steps(graph, skip: int) -> dict[int, float]:
    rows = compare_steps(graph, simulate(graph))
    last = max(r.step for r in rows)
    out = {}
    for rank in sorted(graph.nodes):
        mine = [r for r in rows if r.rank == rank and skip <= r.step < last]
        out[rank] = (statistics.median(r.measured_ns for r in mine) / 1e6,
                     statistics.median(r.predicted_ns for r in mine) / 1e6)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graph", help="a real run's graph directory (RUN/graph/real)")
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    ns = p.parse_args()
    graph = read_graph(ns.graph)
    typical = dataclasses.replace(graph, nodes={r: typical_steps(n, ns.skip) for r, n in graph.nodes.items()})
    as_recorded, medians = _median_steps(graph, ns.skip), _median_steps(typical, ns.skip)
    print(f"{'rank':>5s}{'real':>10s}{'simulated':>11s}{'typical spans':>15s}   (ms per step, medians)")
    for rank in sorted(graph.nodes):
        real, sim = as_recorded[rank]
        print(f"{rank:5d}{real:10.2f}{sim:11.2f}{medians[rank][1]:15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
