"""The calibrated prediction of a kept run directory (``bench/emulate_fidelity.py --keep`` job
directories) recomputed from its calibration takes with each merge of ``bench/_calibration_takes.py``
(``median`` and ``rotated``: prism's, ``prism calibrate --merge``; ``per-step``: each take's spans step by
step, averaged over the takes), and with
each take alone (``take K``), against the median over the further real runs (``real-repeats/``) of
each step, as the benchmark compares them.

    python bench/_debug/recalibrate.py RUN [--ranks 2,5] [--skip 2] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _calibration_takes import MERGES, prediction_steps_ms, steps_ms, takes_by_rank  # noqa: E402
from wait_kinds import real_graphs  # noqa: E402

from prism.graph.io import read_graph  # noqa: E402
from prism.graph.records import NodeKind  # noqa: E402


def real_steps_ms(run: Path, rank: int) -> list[float]:
    graphs = [g for name, g in real_graphs(run) if name != "real"] or [run / "graph" / "real"]
    runs = []
    for g in graphs:
        ends = [n.start_ns for n in read_graph(g).nodes[rank] if n.kind is NodeKind.MARK and n.mark == "step_end"]
        runs.append([(b - a) / 1e6 for a, b in zip([ends[0], *ends], ends, strict=False)])
    return [statistics.median(s) for s in zip(*runs, strict=False)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--ranks", default="2,5")
    p.add_argument("--skip", type=int, default=2, help="warm-up steps")
    p.add_argument("--steps", type=int, default=5, help="measured steps compared")
    a = p.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    truth = {r: real_steps_ms(a.run, r) for r in ranks}
    takes = takes_by_rank(a.run)
    rows = {m: prediction_steps_ms(a.run, a.skip, m) for m in MERGES}
    for k in range(min(len(ts) for ts in takes.values())):
        rows[f"take {k}"] = steps_ms(a.run, {r: ts[k] for r, ts in takes.items()}, a.skip)
    for name, steps in rows.items():
        cols = []
        for r in ranks:
            window = range(a.skip, min(a.skip + a.steps, len(steps[r]), len(truth[r])))
            c, t = (statistics.fmean(x[s] for s in window) for x in (steps[r], truth[r]))
            cols.append(f"r{r}: {c:.1f} ms vs real {t:.1f} ({(c / t - 1) * 100:+.2f} %)")
        print(f"{name:9s} " + "  ".join(cols))


if __name__ == "__main__":
    main()
