"""Median time of each hop after the script issued a collective of group GID (the first such mark
after each issue), from a probe directory (``apply.py``): the sandbox rank's process file (the one
with ``issue ... gGID`` marks) and the replayer files beside it, merged on ``perf_counter_ns``.
With a memory pass, the timed emulation's files are the later ones (pid order). A vrank released
before the script's issue shows no ``V released`` / ``V start`` / ``V posted`` of its own: the
first one after the issue is then the next op's.

    python bench/_debug/hop_probe/hops.py DIR GID [--op all_reduce]
"""
import argparse
import statistics
from collections import defaultdict
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("gid")
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--window-us", type=float, default=5000)
    a = p.parse_args()
    issue = f"issue {a.op} g{a.gid}"
    files = sorted(a.dir.glob("*.txt"), key=lambda f: int(f.stem))
    events, issues, sandbox = [], [], []
    for f in files:
        lines = [line.split(maxsplit=2) for line in f.read_text().splitlines()]
        if any(name == issue for _, _, name in lines):
            issues = [int(t) for t, _, name in lines if name == issue]  # the last such file: the timed run
            sandbox = [(int(t), th, name) for t, th, name in lines]
    for f in files:
        lines = [line.split(maxsplit=2) for line in f.read_text().splitlines()]
        events += [(int(t), th, name) for t, th, name in lines if th == f"prism-replay-{a.gid}"]
    if not issues:
        raise SystemExit(f"{a.dir}: no '{issue}' mark")
    events = sorted(events + [e for e in sandbox if e[1] in ("MainThread", f"prism-live-c-{a.gid}")])
    hops = defaultdict(list)
    for t0 in issues:
        seen = set()
        for t, _, name in events:
            if t0 < t < t0 + a.window_us * 1e3 and name not in seen and not name.startswith("issue"):
                seen.add(name)
                hops[name].append((t - t0) / 1e3)
                if name == "complete":
                    break
    print(f"{len(issues)} x '{issue}', µs after the issue: median (p10, p90), n")
    for name, v in sorted(hops.items(), key=lambda kv: statistics.median(kv[1])):
        v.sort()
        print(f"  {name:18s} {statistics.median(v):8.1f} ({v[len(v) // 10]:7.1f}, {v[9 * len(v) // 10]:7.1f}) {len(v):4d}")


if __name__ == "__main__":
    main()
