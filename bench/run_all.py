"""Run every CPU benchmark and write bench/results/*.json (the README's figures).

    python bench/run_all.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# (script, arguments, the flag that takes the JSON path: collect_templates' --out is a run directory)
BENCHMARKS = [
    ("simulate_accuracy.py", [], "--out"),
    ("mesh_scale.py", ["--repeats", "3"], "--out"),
    ("collect_w32.py", [], "--out"),
    ("vrank_scale.py", ["--repeats", "3"], "--out"),
    ("collect_templates.py", ["--compare-full"], "--json"),
    ("validate_models.py", [], "--out"),
    ("faults.py", [], "--out"),  # the disk-full case mounts a tmpfs as root, else RLIMIT_FSIZE
    ("integrity_cost.py", [], "--out"),
    ("emulate_fidelity.py", [], "--out"),  # the timing target needs ≥ 16 cores (docs/emulate.md)
    ("memtrack_cost.py", [], "--out"),
    ("record_overhead.py", [], "--out"),
    ("op_overhead.py", [], "--out"),
    ("replay.py", [], "--out"),
    ("analyze_confusion.py", [], "--out"),
]


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for script, args, flag in BENCHMARKS:
        if not (HERE / script).exists():
            continue
        out = RESULTS / script.replace(".py", ".json")
        print(f"== {script}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *args, flag, str(out)])
        if code:
            failed.append(script)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
