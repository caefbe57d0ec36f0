"""Summarize record_profile.sh's GC logs: per rank process, collections and their CPU per measured
step (from the 3rd optimizer.step to the last). Usage: python gc_steps.py OUT"""
import glob
import json
import sys

for side in ("gc_plain", "gc_rec"):
    for f in sorted(glob.glob(f"{sys.argv[1]}/{side}/gc-*.json")):
        d = json.load(open(f))
        if len(d["steps"]) < 4:
            continue
        a, b = d["steps"][2], d["steps"][-1]
        n = len(d["steps"]) - 3
        ev = [e for e in d["events"] if a <= e[0] < b]
        per = {g: (sum(1 for e in ev if e[1] == g) / n, 1e3 * sum(e[2] for e in ev if e[1] == g) / n) for g in range(3)}
        print(side, f.split("/")[-1], "per step: " + "  ".join(f"gen{g} {c:.2f}x {ms:.3f} ms" for g, (c, ms) in per.items()),
              f"step {1e3 * (b - a) / n:.1f} ms")
