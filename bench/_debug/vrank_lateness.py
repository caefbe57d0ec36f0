"""How late each vrank issued its ops against its timed schedule, per emulation of a kept run
directory: for every issue in ``replayer-*.clock.json``, its real time minus (the op's start in the
timed graph + the vrank's offset at that moment, the last ``anchor`` event before it), by op kind,
over the measured steps. ``TimedClock.issue_at_ns`` plans each issue at that sum; a wake lead
(the median of recent wake-ups' lateness) centres the median, and what is left is the tail.

A collective's hosted vranks are waited for one after the other on the channel's thread, and the
party starts when the last is due. So a collective's lateness is its party's: the last issue among
the vranks of that replayer minus the latest plan among them, the same for each of those vranks. A
vrank planned early is not late when it waits for a member planned later (session 41:
fsdp2-sleep's vrank 3, "+5.6 ms" per step in session 40, waited for vrank 1's plan).

    python bench/_debug/vrank_lateness.py RUN [--skip 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prism.graph.io import read_graph  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--skip", type=int, default=2, help="steps before this one are left out (warm-up)")
    a = p.parse_args()
    timed = read_graph(a.run / "graph" / "timed").nodes
    for d in sorted(glob.glob(str(a.run / "emulations" / "*"))):
        for clock in sorted(glob.glob(f"{d}/replayer-*.clock.json")):
            by_vrank: dict[int, list] = {}
            for vrank, index, kind, ns in json.loads(Path(clock).read_text()):
                by_vrank.setdefault(vrank, []).append((index, kind, ns))
            issues = []  # (vrank, node, real issue, plan)
            for vrank, events in sorted(by_vrank.items()):
                nodes = {n.index: n for n in timed[vrank]}
                offset = None
                for index, kind, ns in events:
                    if kind == "anchor":
                        offset = ns
                    elif kind == "issue" and offset is not None and nodes[index].step >= a.skip:
                        issues.append((vrank, nodes[index], ns, nodes[index].start_ns + offset))
            party_plan: dict[tuple, float] = {}
            party_issue: dict[tuple, float] = {}
            for _, n, ns, plan in issues:
                if n.kind.name == "COLLECTIVE":
                    key = (n.group_id, n.seq)
                    party_plan[key] = max(plan, party_plan.get(key, plan))
                    party_issue[key] = max(ns, party_issue.get(key, ns))
            for vrank in sorted(by_vrank):
                steps = {n.step for n in timed[vrank] if n.step >= a.skip}
                late: dict[str, list[float]] = {}
                for v, n, ns, plan in issues:
                    if v == vrank:
                        if n.kind.name == "COLLECTIVE":
                            ns, plan = party_issue[(n.group_id, n.seq)], party_plan[(n.group_id, n.seq)]
                        late.setdefault(n.kind.name, []).append((ns - plan) / 1e3)
                cols = "  ".join(
                    f"{k}: {len(x)} issues, median {statistics.median(x):+.0f} us, p90 "
                    f"{sorted(x)[int(0.9 * (len(x) - 1))]:+.0f} us, late sum {sum(max(0.0, y) for y in x) / 1e3 / max(1, len(steps)):.2f} ms/step"
                    for k, x in sorted(late.items()))
                print(f"{Path(d).name} vrank {vrank}: {cols}")


if __name__ == "__main__":
    main()
