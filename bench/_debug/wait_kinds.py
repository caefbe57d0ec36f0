"""The script's waits of one rank, by the kind of op waited for (SEND / RECV / each collective op): count,
median and sum per measured step (a synchronous collective's call counts as its wait, "op(sync)"),
in the real run(s), the timed graph and each emulation of a run
directory (a ``bench/emulate_fidelity.py --keep DIR`` job directory, or a ``prism validate`` run).
A wait for a send posted long before should cost what it costs in the real run; on the sandbox path
it carried the send's divergence check (docs/emulate.md, "A send's wait on the sandbox path").

    python bench/_debug/wait_kinds.py RUN 2 [--skip 3]
"""

from __future__ import annotations

import argparse
import glob
import pickle
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prism.graph.io import read_graph  # noqa: E402
from prism.graph.records import NodeKind  # noqa: E402


def parse_args(description: str | None = None) -> argparse.Namespace:
    """``RUN RANK [--skip N]``, as this script and ``msg_timing.py`` take them."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("run", type=Path)
    p.add_argument("rank", type=int)
    p.add_argument("--skip", type=int, default=3, help="steps before this one are left out (warm-up)")
    return p.parse_args()


def emulations(run: Path, rank: int, timed) -> list[tuple[Path, object, dict[tuple, dict[str, int]]]]:
    """Each emulation of ``run``: its directory, ``rank``'s record, and the replayers' ``issue`` and
    ``complete`` times (perf_counter_ns) of each vrank's ops, keyed by (vrank, op key) through the
    timed graph ``timed``."""
    from prism.graph.livesim import op_key
    from prism.vrank_replayer.replayer import clock_events

    out = []
    for emu in sorted(glob.glob(str(run / "emulations" / "*" / f"rank-{rank:05d}.pkl"))):
        d = Path(emu).parent
        with open(emu, "rb") as f:
            rec = pickle.load(f)
        events: dict[tuple, dict[str, int]] = {}
        for vrank, index, kind, ns in clock_events(d):
            if kind in ("issue", "complete"):
                events.setdefault((vrank, op_key(timed.nodes[vrank][index])), {})[kind] = ns
        out.append((d, rec, events))
    return out


def real_graphs(run: Path) -> list[tuple[str, Path]]:
    """The run's real graphs, named: ``real``, then ``real1``, ... (``bench/emulate_fidelity.py``'s
    further real runs under ``real-repeats/``)."""
    return [("real", run / "graph" / "real"),
            *((f"real{Path(k).parts[-3]}", Path(k))
              for k in sorted(glob.glob(str(run / "real-repeats" / "*" / "graph" / "real"))))]


def main() -> None:
    a = parse_args()
    run = a.run
    sources = {name: read_graph(g).nodes[a.rank] for name, g in real_graphs(run)}
    if (run / "graph" / "timed").exists():
        sources["timed"] = read_graph(run / "graph" / "timed").nodes[a.rank]
    for i, e in enumerate(sorted(glob.glob(str(run / "emulations" / "*" / f"rank-{a.rank:05d}.pkl")))):
        with open(e, "rb") as f:
            sources[f"emulated{i}"] = pickle.load(f).nodes
    for name, nodes in sources.items():
        by_index = {n.index: n for n in nodes}
        steps = {n.step for n in nodes if n.step >= a.skip}
        waits: dict[str, list[float]] = {}
        for n in nodes:
            if n.kind is NodeKind.WAIT and n.step >= a.skip and n.target in by_index:
                t = by_index[n.target]
                kind = t.op.value if t.kind is NodeKind.COLLECTIVE and t.op is not None else t.kind.name
                waits.setdefault(kind, []).append(n.duration_ns / 1e3)
            elif n.kind is NodeKind.COLLECTIVE and not n.is_async and n.step >= a.skip and n.op is not None:
                waits.setdefault(n.op.value + "(sync)", []).append(n.duration_ns / 1e3)  # the call is its wait
        cols = "  ".join(f"{k}: {len(v)} waits, median {statistics.median(v):.0f} us, {sum(v) / 1e3 / max(1, len(steps)):.2f} ms/step"
                         for k, v in sorted(waits.items()))
        print(f"rank {a.rank} {name:10s} {cols}")


if __name__ == "__main__":
    main()
