#!/usr/bin/env python3
"""Fault-injection validation of the gap classifier (GapScope): every case of
``prism.analysis.inject.cases`` (six per class: launch gaps, a queued critical op or gradients
waited synchronously, a slow replica, pipeline bubbles, comm larger than the work that can hide it)
is executed by prism's discrete-event pass into an observed graph and analyzed; the verdict of
each case (the largest class over its steps after the first) is compared with what was injected.

    python bench/analyze_confusion.py   # -> bench/results/analyze_confusion.json

Synthetic graphs built through the graph API, not real runs: on the 2-core host a real run's
timing is dominated by CPU contention (docs/analyze.md), and a case is worth one ground truth.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.analysis import CLASSES, analyze_graph
from prism.analysis.inject import cases

log = logging.getLogger("analyze_confusion")
OUT = Path(__file__).resolve().parent / "results" / "analyze_confusion.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="JSON results (default: %(default)s)")
    out = parser.parse_args().out
    t0 = time.perf_counter()
    rows = []
    confusion = collections.Counter()
    for case in cases():
        report = analyze_graph(case.graph, peers=case.peers, skip_steps=1)
        mean = report.mean_classes_ns()
        confusion[(case.injected, report.verdict)] += 1
        rows.append({"case": case.name, "injected": case.injected, "verdict": report.verdict,
                     "observed_ms": report.mean_ns("observed_ns") / 1e6, "t_lb_ms": report.mean_ns("lower_bound_ns") / 1e6,
                     "classes_ms": {c: round(v / 1e6, 3) for c, v in mean.items()}})
    total = len(rows)
    diagonal = sum(confusion[(c, c)] for c in CLASSES)
    matrix = {i: {v: confusion[(i, v)] for v in CLASSES} for i in CLASSES}
    data = {"cases": total, "diagonal": diagonal, "diagonal_fraction": diagonal / total, "matrix": matrix,
            "rows": rows, "seconds": round(time.perf_counter() - t0, 2), "source": "synthetic graphs (prism.analysis.inject)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    table = Table(title=f"injected (rows) vs verdict (columns): {diagonal}/{total} on the diagonal", title_justify="left")
    table.add_column("injected")
    for c in CLASSES:
        table.add_column(c, justify="right")
    for i in CLASSES:
        table.add_row(i, *(str(matrix[i][v]) for v in CLASSES))
    Console().print(table)
    log.info("wrote %s", out)
    return 0 if diagonal / total >= 0.9 else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
