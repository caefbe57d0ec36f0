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

from _calibration_takes import MERGES, CalibrationTakes  # noqa: E402
from wait_kinds import real_graphs  # noqa: E402

from prism.graph.io import read_graph  # noqa: E402
from prism.vrank_replayer.fidelity import median_steps  # noqa: E402


def real_steps_ms(run: Path, rank: int) -> list[float]:
    """The per-step median of the further real runs (the first one's alone when there are none),
    from their recorded step times, as the benchmark takes them."""
    graphs = [read_graph(g) for name, g in real_graphs(run) if name != "real"] or [read_graph(run / "graph" / "real")]
    runs = [[s / 1e6 for s in g.summaries[rank].step_times_ns] for g in graphs]
    return median_steps(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--ranks", default="2,5")
    p.add_argument("--skip", type=int, default=2, help="warm-up steps")
    p.add_argument("--steps", type=int, default=5, help="measured steps compared")
    a = p.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    truth = {r: real_steps_ms(a.run, r) for r in ranks}
    takes = CalibrationTakes(a.run, a.skip)
    rows = {m: takes.prediction_steps_ms(m) for m in MERGES}
    rows.update({f"take {k}": takes.take_steps_ms(k) for k in range(takes.count)})
    for name, steps in rows.items():
        cols = []
        for r in ranks:
            window = range(a.skip, min(a.skip + a.steps, len(steps[r]), len(truth[r])))
            c, t = (statistics.fmean(x[s] for s in window) for x in (steps[r], truth[r]))
            cols.append(f"r{r}: {c:.1f} ms vs real {t:.1f} ({(c / t - 1) * 100:+.2f} %)")
        print(f"{name:9s} " + "  ".join(cols))


if __name__ == "__main__":
    main()
