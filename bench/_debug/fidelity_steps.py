"""Per sandbox rank of a ``bench/emulate_fidelity.py --examples`` JSON: compute per step (real,
emulated, calibrated), the real runs' spread, and every measured step of each real run and
emulation (the device scripts print it after each example).

    python bench/_debug/fidelity_steps.py OUT.json
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    d = json.load(open(sys.argv[1]))
    for j in d["jobs"]:
        for r, v in j.get("ranks", {}).items():
            b = v.get("breakdown_ms", {})
            print(r, "compute real/emu/cal", [b.get(k, {}).get("compute_ms") for k in ("real", "emulated", "calibrated")],
                  "spread", round(sp["mean_abs_rel_error"] * 100, 2) if (sp := v.get("real_run_spread")) else None)
            for k in ("real_runs_step_ms", "emulated_runs_step_ms"):
                for e in v.get(k, []):
                    print(" ", k.split("_")[0], [round(x, 1) for x in e[1:]])


if __name__ == "__main__":
    main()
