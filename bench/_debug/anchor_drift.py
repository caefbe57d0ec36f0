"""How far each vrank's clock offset drifts per step in an emulation, and what drives it (session 42).

A vrank issues op j at its timed-graph time plus an offset; the offset is re-anchored when an op
the vrank waits for completes for real (docs/emulate.md, "The timed co-simulation clock"). A drift
of the offset from step to step is time the emulation adds over its timed graph (pp 1F1B at its
default size on 16 cores: +1.5 … +6.6 ms per step, its whole excess). Per emulation of RUN:

* each vrank's offset at the end of each measured step, relative to the first measured step;
* per kind of anchoring op (a message with a sandbox rank, a collective), the offset's increases
  and net change per step (summed over the vranks), the six groups whose ops moved it most, and for
  a message the replayer's **notice
  delay**: for a vrank's receive, its completion stamp minus max(the sandbox's send post, the
  vrank's receive post); for a vrank's send, its completion stamp minus the end of the sandbox's
  wait for that receive (both on the host's ``perf_counter_ns`` clock, through
  ``RankRecord.clock_origin_ns``). "Saved" bounds what true stamps would take off the increases:
  each increase less its notice delay (less 40 µs of transfer for a receive), at least 0.

    python bench/_debug/anchor_drift.py RUN [--skip 2]
"""

from __future__ import annotations

import argparse
import collections
import glob
import pickle
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prism.graph.io import read_graph  # noqa: E402
from prism.graph.livesim import op_key  # noqa: E402
from prism.graph.records import NodeKind  # noqa: E402
from prism.vrank_replayer.replayer import clock_events  # noqa: E402

_TRANSFER_NS = 40_000  # a small message's transfer on the real backend (real runs' receive waits)


def _sandbox_stamps(emu: Path) -> tuple[dict, dict]:
    """Per message (receiver-side op key): the sandbox's send post, and the end of its receive's wait."""
    posts, recv_ends = {}, {}
    for f in emu.glob("rank-*.pkl"):
        with open(f, "rb") as fh:
            rec = pickle.load(fh)
        by_index = {n.index: n for n in rec.nodes}
        for n in rec.nodes:
            if n.kind is NodeKind.SEND:
                posts[(n.peer, op_key(n))] = rec.clock_origin_ns + n.start_ns
            elif n.kind is NodeKind.WAIT and n.target in by_index and by_index[n.target].kind is NodeKind.RECV:
                r = by_index[n.target]
                recv_ends[(r.peer, op_key(r))] = rec.clock_origin_ns + n.start_ns + n.duration_ns
    return posts, recv_ends


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--skip", type=int, default=2, help="steps before this one are left out (warm-up)")
    a = p.parse_args()
    timed = read_graph(a.run / "graph" / "timed")
    for emu in sorted(Path(d) for d in glob.glob(str(a.run / "emulations" / "*"))):
        events = clock_events(emu)
        if not events:
            continue
        stamps: dict[tuple[int, int], dict[str, int]] = collections.defaultdict(dict)
        for v, i, kind, ns in events:
            if kind != "anchor":
                stamps[(v, i)][kind] = ns
        posts, recv_ends = _sandbox_stamps(emu)
        at_step_end: dict[int, dict[int, int]] = collections.defaultdict(dict)
        by_kind = collections.defaultdict(lambda: {"n": 0, "up": 0, "net": 0, "delay": [], "saved": 0})
        by_group: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])  # (kind, op, group, its size) -> anchors, net change
        last: dict[int, int] = {}
        for v, i, kind, offset in events:
            if kind != "anchor":
                continue
            node = timed.nodes[v][i]
            at_step_end[v][node.step] = offset
            if v in last and node.step >= a.skip:
                change, st = offset - last[v], stamps[(v, i)]
                delay = None
                if "complete" in st and node.kind is NodeKind.RECV and (v, op_key(node)) in posts:
                    delay = st["complete"] - max(posts[(v, op_key(node))], st.get("issue", 0)) - _TRANSFER_NS
                elif "complete" in st and node.kind is NodeKind.SEND and (v, op_key(node)) in recv_ends:
                    delay = st["complete"] - recv_ends[(v, op_key(node))]
                g = by_group[(node.kind.name, node.op.value, node.group_id, len(timed.groups[node.group_id].ranks))]
                g[0] += 1
                g[1] += change
                b = by_kind[node.kind.name if delay is not None else f"{node.kind.name} (no delay read)"]
                b["n"] += 1
                b["net"] += change
                if change > 0:
                    b["up"] += change
                    if delay is not None:
                        b["saved"] += min(change, max(0, delay))
                if delay is not None:
                    b["delay"].append(delay)
            last[v] = offset
        steps = sorted({s for per in at_step_end.values() for s in per if s >= a.skip})
        print(f"{emu.name}: {len(at_step_end)} vranks, measured steps {steps[0]}..{steps[-1]}" if steps else emu.name)
        for v, per in sorted(at_step_end.items()):
            base = per.get(a.skip)
            if base is not None:
                print(f"  vrank {v}: offset at each step's end, ms from step {a.skip}: "
                      + " ".join(f"{(per[s] - base) / 1e6:+.2f}" for s in steps if s in per))
        n = max(1, len(steps))  # each measured step's anchors, the first's included
        for kind, b in sorted(by_kind.items()):
            line = (f"  {kind}: {b['n']} anchors; per step over the vranks: increases {b['up'] / 1e6 / n:.2f} ms, "
                    f"net {b['net'] / 1e6 / n:+.2f} ms")
            if b["delay"]:
                line += (f"; notice delay median {statistics.median(b['delay']) / 1e3:.0f} us, p90 "
                         f"{sorted(b['delay'])[9 * len(b['delay']) // 10] / 1e3:.0f} us; saved with true stamps "
                         f"<= {b['saved'] / 1e6 / n:.2f} ms")
            print(line)
        for (kind, op, group, size), (count, net) in sorted(by_group.items(), key=lambda kv: -kv[1][1])[:6]:
            print(f"    {op} on group {group} ({size} ranks): {count} anchors, net {net / 1e6 / n:+.2f} ms per step")


if __name__ == "__main__":
    main()
