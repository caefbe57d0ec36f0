"""Run every CPU benchmark and write bench/results/*.json (the README's figures).

    python bench/run_all.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

BENCHMARKS = [
    ("simulate_accuracy.py", []),
    ("mesh_scale.py", ["--repeats", "3"]),
    ("collect_w32.py", []),
    ("vrank_scale.py", []),
]


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for script, args in BENCHMARKS:
        if not (HERE / script).exists():
            continue
        out = RESULTS / script.replace(".py", ".json")
        print(f"== {script}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *args, "--out", str(out)])
        if code:
            failed.append(script)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
