"""Compare record_profile.sh's main-thread profiles (wall clock, from the 3rd step on): a plain
launch's ranks (prof_plain/) against ``prism record``'s timed pass (prof_rec/, ``*-timed.prof``),
per rank-step: the functions whose own time and whose cumulative time differ most.
Usage: python profile_diff.py OUT"""
import glob
import pstats
import re
import sys
from collections import defaultdict

out = sys.argv[1]
sides = {"plain": sorted(glob.glob(f"{out}/prof_plain/main-*-run.prof")),
         "rec": sorted(glob.glob(f"{out}/prof_rec/main-*-timed.prof"))}
res, steps = {}, {}
for name, files in sides.items():
    steps[name] = sum(int(open(f[:-5] + ".steps").read()) for f in files)
    s = pstats.Stats(*files)
    res[name] = defaultdict(lambda: [0, 0.0, 0.0])
    for k, v in s.stats.items():
        key = re.sub(r".*/(site-packages|prism|cwd|examples)/", r"\1/", k[0]) + f":{k[1]}({k[2]})"
        key = re.sub(r" at 0x[0-9a-f]+", "", key)
        r = res[name][key]
        r[0] += v[1]
        r[1] += v[2]
        r[2] += v[3]
    print(f"{name}: {len(files)} ranks, {steps[name]} rank-steps profiled, "
          f"{1e3 * s.total_tt / max(1, steps[name]):.2f} ms of profiled wall per rank-step")


def per(side, k, i):
    return 1e3 * res[side][k][i] / steps[side] if k in res[side] else 0.0


keys = set(res["plain"]) | set(res["rec"])
for title, i in (("own", 1), ("cumulative", 2)):
    print(f"ms per rank-step, {title} time, rec - plain   (plain -> rec)   [calls per rank-step plain -> rec]")
    for k in sorted(keys, key=lambda k: -abs(per("rec", k, i) - per("plain", k, i)))[:30]:
        c = [res[s][k][0] / steps[s] if k in res[s] else 0 for s in ("plain", "rec")]
        print(f"{per('rec', k, i) - per('plain', k, i):+8.3f}  ({per('plain', k, i):.3f} -> {per('rec', k, i):.3f})"
              f"  [{c[0]:.1f} -> {c[1]:.1f}]  {k[-110:]}")
