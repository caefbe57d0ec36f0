"""Where a sandbox rank's message waits go in an emulation: for each send or receive between a
sandbox rank and a virtual rank, the sandbox's post and wait (its rank record, on the host's
``perf_counter_ns`` clock through ``RankRecord.clock_origin_ns``) beside the replayer's issue and
completion of the vrank's part (``replayer-*.clock.json``, the same clock). Medians over the
measured steps, per emulation, in µs:

* SEND: the wait; how long after the wait began the vrank's receive was issued (negative: before)
  and completed as the replayer saw it; the wait of the sends whose receive was issued before the
  wait began (their excess is the sandbox's own path, not a late vrank).
* RECV: the wait; how late the vrank's send was issued after the wait began (negative: before);
  the wait's end after ``max(wait start, vrank's issue)`` (the delivery, once both ends are there);
  the wait's end after the receive's post; the replayer's completion of the send after the wait's
  end (the replayer's thread learns of it after gloo wrote the data).

    python bench/_debug/msg_timing.py RUN RANK [--skip 3]   # RUN: a run directory with emulations
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prism.graph.io import read_graph  # noqa: E402
from prism.graph.livesim import op_key  # noqa: E402
from prism.graph.records import NodeKind  # noqa: E402
from wait_kinds import emulations, parse_args, real_graphs  # noqa: E402  (this script's folder)


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.0f}" if xs else "      -"


def _real(run: Path, a) -> None:
    """The real runs' receives (from every peer, sandbox or not): their waits and the time from each
    receive's post to its wait's end."""
    for name, g in real_graphs(run):
        nodes = read_graph(g).nodes[a.rank]
        by_index = {n.index: n for n in nodes}
        waits, posts = [], []
        for w in nodes:
            if w.kind is NodeKind.WAIT and w.step >= a.skip and w.target in by_index:
                n = by_index[w.target]
                if n.kind is NodeKind.RECV:
                    waits.append(w.duration_ns / 1e3)
                    posts.append((w.start_ns + w.duration_ns - n.start_ns) / 1e3)
        print(f"{name:8s} RECV (every peer): {len(waits)} waits {_med(waits)} us, post to wait end {_med(posts)} us")


def main() -> None:
    a = parse_args()
    run = a.run
    timed = read_graph(run / "graph" / "timed")
    _real(run, a)
    print("          SEND: n  wait  v.issue-w0  v.done-w0  wait|v.issued-before   "
          "RECV: n  wait  v.issue-w0  w1-max(w0,v.issue)  w1-post  v.done-w1")
    for d, rec, events in emulations(run, a.rank, timed):
        origin = rec.clock_origin_ns
        by_index = {n.index: n for n in rec.nodes}
        send = {"wait": [], "issue": [], "done": [], "early": []}
        recv = {"wait": [], "issue": [], "deliver": [], "post": [], "done": []}
        for w in rec.nodes:
            if w.kind is not NodeKind.WAIT or w.step < a.skip or w.target not in by_index:
                continue
            n = by_index[w.target]
            if n.kind not in (NodeKind.SEND, NodeKind.RECV):
                continue
            ev = events.get((n.peer, op_key(n)))
            if not ev or "issue" not in ev:
                continue  # a sandbox peer, or not played
            w0, w1 = origin + w.start_ns, origin + w.start_ns + w.duration_ns
            if n.kind is NodeKind.SEND:
                send["wait"].append(w.duration_ns / 1e3)
                send["issue"].append((ev["issue"] - w0) / 1e3)
                if "complete" in ev:
                    send["done"].append((ev["complete"] - w0) / 1e3)
                if ev["issue"] < w0:
                    send["early"].append(w.duration_ns / 1e3)
            else:
                recv["wait"].append(w.duration_ns / 1e3)
                recv["issue"].append((ev["issue"] - w0) / 1e3)
                recv["deliver"].append((w1 - max(w0, ev["issue"])) / 1e3)
                recv["post"].append((w1 - origin - n.start_ns) / 1e3)
                if "complete" in ev:
                    recv["done"].append((ev["complete"] - w1) / 1e3)
        print(f"{d.name[9:15]:8s} {len(send['wait']):6d} {_med(send['wait'])} {_med(send['issue'])} "
              f"{_med(send['done'])}  {_med(send['early'])} ({len(send['early'])})   {len(recv['wait']):6d} "
              f"{_med(recv['wait'])} {_med(recv['issue'])} {_med(recv['deliver'])} {_med(recv['post'])} {_med(recv['done'])}")


if __name__ == "__main__":
    main()
