"""Which compute spans of a rank a timed graph makes shorter or longer than the real run: per span
(its place in the step and the comm op before it), the median duration over the measured steps in
each graph, largest differences first. For a calibration whose compute misses the real run's
(hybrid-sleep's rank 2 on 16 cores, session 30: 211.6 ms per step in its slice against 225.5 real).
Keep the run directories of a benchmark with ``--keep``.

    python bench/_debug/compute_spans.py --rank 2 --skip 2 RUN/graph/real RUN/graph/timed [--top 20]

The summary after the list splits the spans by whether the comm op before them blocked the rank
(a WAIT or a synchronous collective longer than ``--blocked-us``, medians) in each graph: in a
calibration slice the vranks answer at once, so a wait that blocks in the real run may not block
there; if the spans after such waits are the shorter ones, the slice misses what a blocked wait
costs the compute after it. Session 32 on hybrid-sleep, 16 cores: two calls disagreed in sign
(the slices' compute 2 % under the real run's, then 4 % over), so that was not it.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from prism.graph.io import read_graph
from prism.graph.records import Graph, NodeKind


def span_medians(graph: Graph, rank: int, skip: int) -> dict[tuple[int, str], float]:
    """(index of the compute span in its step, the comm op before it) -> median ms over the steps
    from ``skip`` on, the last (possibly cut) step left out."""
    return {key: span for key, (span, _) in span_and_block_medians(graph, rank, skip).items()}


def span_and_block_medians(graph: Graph, rank: int, skip: int) -> dict[tuple[int, str], tuple[float, float]]:
    """As :func:`span_medians`, with the median ms the rank spent in the comm op just before the
    span (a WAIT or a synchronous op; 0 at the step's start)."""
    nodes_of_rank = graph.nodes[rank]
    steps = defaultdict(list)
    for n in nodes_of_rank:
        if n.step >= skip:
            steps[n.step].append(n)
    durations, blocks = defaultdict(list), defaultdict(list)
    for _, nodes in sorted(steps.items())[:-1]:
        k, before, blocked_ms = 0, "step start", 0.0
        for n in nodes:
            if n.kind is NodeKind.COMPUTE:
                durations[(k, before)].append(n.duration_ns / 1e6)
                blocks[(k, before)].append(blocked_ms)
                k += 1
            elif n.kind is not NodeKind.MARK:
                op = nodes_of_rank[n.target] if n.kind is NodeKind.WAIT and n.target >= 0 else n
                before = f"{n.kind.value} {op.op.value if op.op else ''} {op.call_site}".strip()
                # an async op's issue does not block; its WAIT (or a synchronous op) does
                blocked_ms = max(0, n.duration_ns) / 1e6 if n.kind is NodeKind.WAIT or not n.is_async else 0.0
    return {key: (statistics.median(v), statistics.median(blocks[key])) for key, v in durations.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("real")
    p.add_argument("timed")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--blocked-us", type=float, default=100.0, help="an op before a span longer than this blocked")
    ns = p.parse_args()
    real_both = span_and_block_medians(read_graph(ns.real), ns.rank, ns.skip)
    timed_both = span_and_block_medians(read_graph(ns.timed), ns.rank, ns.skip)
    real = {k: v[0] for k, v in real_both.items()}
    timed = {k: v[0] for k, v in timed_both.items()}
    print(f"rank {ns.rank}: compute per step {sum(real.values()):.1f} ms real, {sum(timed.values()):.1f} ms timed")
    keys = sorted(set(real) | set(timed), key=lambda k: -abs(timed.get(k, 0.0) - real.get(k, 0.0)))
    for k in keys[:ns.top]:
        r, t = real.get(k, 0.0), timed.get(k, 0.0)
        rb, tb = real_both.get(k, (0, 0))[1], timed_both.get(k, (0, 0))[1]
        print(f"span {k[0]:3d} after {k[1][:52]:52s} real {r:7.2f}  timed {t:7.2f}  {t - r:+6.2f} ms"
              f"   op before: real {rb:6.2f} timed {tb:6.2f}")
    limit = ns.blocked_us / 1e3
    classes = defaultdict(lambda: [0, 0.0, 0.0])
    for k in set(real_both) & set(timed_both):
        (r, rb), (t, tb) = real_both[k], timed_both[k]
        c = classes[(rb > limit, tb > limit)]
        c[0] += 1
        c[1] += r
        c[2] += t
    print(f"spans by whether the op before them blocked (> {ns.blocked_us:.0f} us), ms per step:")
    for (rb, tb), (count, r, t) in sorted(classes.items()):
        print(f"  blocked real {'yes' if rb else 'no ':3s} timed {'yes' if tb else 'no ':3s}: {count:3d} spans, "
              f"real {r:7.2f} timed {t:7.2f} ({t - r:+.2f}; {(t - r) / count * 1e3:+.0f} us per span)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
