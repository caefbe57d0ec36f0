"""Each rank's compute and the rest of its step (medians over the measured steps) in every source of a
kept run directory: the real run(s), each calibration slice take (``calibration/slice-NNN[-k]``), the
timed graph and each emulation. For a calibration that misses: which take, which rank, compute or the
rest (STATUS Next 2 of session 39: pp-interleaved's rank 2 computed 262.7 ms per step in the timed
graph against 230.8 real).

    python bench/_debug/take_compute.py RUN [--ranks 2,5] [--skip 3]
"""

from __future__ import annotations

import argparse
import glob
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _examples_fidelity import _breakdown_ms  # noqa: E402
from wait_kinds import real_graphs  # noqa: E402

from prism.graph.io import read_graph  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--ranks", default=None, help="comma-separated ranks (default: every rank)")
    p.add_argument("--skip", type=int, default=3, help="steps before this one are left out (warm-up)")
    p.add_argument("--steps", type=int, default=64, help="steps considered after --skip")
    a = p.parse_args()
    steps = range(a.skip, a.skip + a.steps)
    graphs = {name: read_graph(g).nodes for name, g in real_graphs(a.run)}
    if (a.run / "graph" / "timed").exists():
        graphs["timed"] = read_graph(a.run / "graph" / "timed").nodes
    ranks = [int(r) for r in a.ranks.split(",")] if a.ranks else sorted(next(iter(graphs.values())))
    records: dict[str, dict[int, list]] = {}
    for kind, pattern in (("take", "calibration/slice-*"), ("emulated", "emulations/*")):
        for d in sorted(glob.glob(str(a.run / pattern))):
            for f in sorted(glob.glob(f"{d}/rank-*.pkl")):
                with open(f, "rb") as fh:
                    records.setdefault(f"{kind} {Path(d).name}", {})[int(Path(f).stem.split("-")[1])] = pickle.load(fh).nodes
    for r in ranks:
        print(f"rank {r}")
        rows = [(name, nodes[r]) for name, nodes in graphs.items() if r in nodes]
        rows += [(name, by_rank[r]) for name, by_rank in records.items() if r in by_rank]
        for name, nodes in rows:
            b = _breakdown_ms(nodes, steps)
            if b:
                print(f"  {name:40s} compute {b['compute_ms']:9.3f} ms  rest {b['rest_ms']:8.3f} ms")


if __name__ == "__main__":
    main()
