"""Virtual world scale: one process becomes rank W-3 of W for the hybrid example (3-D mesh
(pp=2, dp=W/4, tp=2) + one training step with fake values), with prism's "prism" group and
with PyTorch's built-in fake process group, side by side.

    python bench/mesh_scale.py [--worlds 1024,16384,65536,262144] [--repeats 3] [--out FILE.json]

Each measurement runs in a fresh process; the table shows medians over the repeats: wall time
and CPU time of the mesh init (CPU time is what to compare on a shared machine, where a process
may wait for a core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("_mesh_child.py")


def measure(mode: str, world: int) -> dict:
    out = subprocess.run([sys.executable, str(CHILD), mode, str(world)], capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"mode": mode, "world_size": world, "error": out.stderr[-500:], "step_ok": False}
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="1024,16384,65536,262144")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    ns = p.parse_args()
    rows = []
    for world in [int(w) for w in ns.worlds.split(",")]:
        modes = ("prism", "torch-fake")
        by_mode: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(ns.repeats):  # alternate, so both modes see the same machine
            for mode in modes:
                by_mode[mode].append(measure(mode, world))
        for mode in modes:
            runs = by_mode[mode]
            ok = [r for r in runs if r.get("mesh_init_s") is not None]

            def med(key, ok=ok):
                return statistics.median(r[key] for r in ok) if ok else None

            rows.append({
                "world_size": world, "mode": mode, "mesh_init_s": med("mesh_init_s"),
                "mesh_init_cpu_s": med("mesh_init_cpu_s"), "total_s": med("total_s"),
                "peak_rss_mib": med("peak_rss_mib"), "step_ok": all(r.get("step_ok") for r in runs),
                "error": next((r["error"] for r in runs if r.get("error")), ""),
            })
            print(json.dumps(rows[-1]), flush=True)
    print()
    print(f"{'W':>8} {'mode':>11} {'mesh init s':>12} {'(CPU s)':>8} {'total s':>8} {'peak RSS MiB':>13}  step")
    for r in rows:
        fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        step = "ok" if r["step_ok"] else f"FAILED: {r['error'][:60]}"
        print(f"{r['world_size']:>8} {r['mode']:>11} {fmt(r['mesh_init_s'], '12.2f')} "
              f"{fmt(r['mesh_init_cpu_s'], '8.2f')} {fmt(r['total_s'], '8.2f')} "
              f"{fmt(r['peak_rss_mib'], '13.0f')}  {step}")
    if ns.out:
        Path(ns.out).write_text(json.dumps({"benchmark": "mesh_scale", "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
