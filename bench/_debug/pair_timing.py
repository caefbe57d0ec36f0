"""Where a sandbox rank's 2-rank collectives spend their time (a TP all-reduce with one vrank
partner): for each collective of a 2-member group, its completion after the later of the two
issues (the protocol's own cost once both ends are there), in the real runs (both ranks' records),
in each calibration take whose slice holds both ranks, and in each emulation (the sandbox's record beside the replayer's issue and completion of the
vrank's part, ``replayer-*.clock.json``, on the same ``perf_counter_ns`` clock). Also who issued
last and by how much. Medians over the measured steps, µs, per group.

    python bench/_debug/pair_timing.py RUN RANK [--skip 2]
"""

from __future__ import annotations

import glob
import pickle
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prism.graph.io import read_graph  # noqa: E402
from prism.graph.livesim import op_key  # noqa: E402
from prism.graph.records import Node, NodeKind  # noqa: E402
from wait_kinds import emulations, parse_args, real_graphs  # noqa: E402  (this script's folder)


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.0f}" if xs else "      -"


def _ends(nodes: tuple[Node, ...] | list[Node]) -> dict[int, int]:
    """Each collective's completion (ns on the record's clock): its wait's end if it has one, else its own end."""
    ends = {n.index: n.start_ns + n.duration_ns for n in nodes if n.kind is NodeKind.COLLECTIVE}
    for w in nodes:
        if w.kind is NodeKind.WAIT and w.target in ends:
            ends[w.target] = max(ends[w.target], w.start_ns + w.duration_ns)
    return ends


def main() -> None:
    a = parse_args(__doc__)
    run = a.run
    timed = read_graph(run / "graph" / "timed")
    pairs = {gid: g.ranks for gid, g in timed.groups.items() if len(g.ranks) == 2 and a.rank in g.ranks}
    if not pairs:
        sys.exit(f"rank {a.rank} is in no 2-rank group")
    print(f"rank {a.rank}, groups {pairs}; per group: n, done after the later issue, the partner's issue after ours"
          " (median us)")
    for name, gdir in real_graphs(run):
        g = read_graph(gdir)
        for gid, ranks in sorted(pairs.items()):
            peer = ranks[0] if ranks[1] == a.rank else ranks[1]
            mine = [n for n in g.nodes[a.rank] if n.kind is NodeKind.COLLECTIVE and n.group_id == gid and n.step >= a.skip]
            theirs = {op_key(n): n for n in g.nodes[peer] if n.kind is NodeKind.COLLECTIVE and n.group_id == gid}
            ends = _ends(g.nodes[a.rank])
            done, late = [], []
            for n in mine:
                p = theirs.get(op_key(n))
                if p is None:
                    continue
                done.append((ends[n.index] - max(n.start_ns, p.start_ns)) / 1e3)
                late.append((p.start_ns - n.start_ns) / 1e3)
            print(f"{name:8s} group {gid}: {len(done):4d} {_med(done)} {_med(late)}")
    for take in sorted(glob.glob(str(run / "calibration" / "*" / f"rank-{a.rank:05d}.pkl"))):
        d = Path(take).parent
        recs = {}
        for r in {x for ranks in pairs.values() for x in ranks}:
            if (d / f"rank-{r:05d}.pkl").exists():
                with open(d / f"rank-{r:05d}.pkl", "rb") as f:
                    recs[r] = pickle.load(f)
        for gid, ranks in sorted(pairs.items()):
            peer = ranks[0] if ranks[1] == a.rank else ranks[1]
            if peer not in recs:
                continue  # the partner was a vrank of this slice
            me, other = recs[a.rank], recs[peer]
            theirs = {op_key(n): n for n in other.nodes if n.kind is NodeKind.COLLECTIVE and n.group_id == gid}
            ends = _ends(me.nodes)
            done, late = [], []
            for n in me.nodes:
                p = theirs.get(op_key(n)) if n.kind is NodeKind.COLLECTIVE and n.group_id == gid and n.step >= a.skip else None
                if p is None:
                    continue
                mine_ns, theirs_ns = me.clock_origin_ns + n.start_ns, other.clock_origin_ns + p.start_ns
                done.append((me.clock_origin_ns + ends[n.index] - max(mine_ns, theirs_ns)) / 1e3)
                late.append((theirs_ns - mine_ns) / 1e3)
            print(f"{d.name:8s} group {gid}: {len(done):4d} {_med(done)} {_med(late)}   (take: both ranks real)")
    for d, rec, events in emulations(run, a.rank, timed):
        origin = rec.clock_origin_ns
        ends = _ends(rec.nodes)
        for gid, ranks in sorted(pairs.items()):
            peer = ranks[0] if ranks[1] == a.rank else ranks[1]
            done, late, vdone = [], [], []
            for n in rec.nodes:
                if n.kind is not NodeKind.COLLECTIVE or n.group_id != gid or n.step < a.skip:
                    continue
                ev = events.get((peer, op_key(n)))
                if not ev or "issue" not in ev:
                    continue  # a sandbox peer, or not played
                issued = origin + n.start_ns
                done.append((origin + ends[n.index] - max(issued, ev["issue"])) / 1e3)
                late.append((ev["issue"] - issued) / 1e3)
                if "complete" in ev:
                    vdone.append((ev["complete"] - max(issued, ev["issue"])) / 1e3)
            print(f"{d.name[9:15]:8s} group {gid}: {len(done):4d} {_med(done)} {_med(late)}"
                  f"   vrank's completion after the later issue {_med(vdone)}")


if __name__ == "__main__":
    main()
