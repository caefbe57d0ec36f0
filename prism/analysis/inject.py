"""Fault injection for validating the gap classifier: small training programs with one injected
cause of idle time, executed by prism's discrete-event pass (:func:`prism.graph.simulate`) into an
observed graph, as a recording would have it.

Programs are written per rank with :class:`Program` (compute, comm, waits, step ends). A *launch
gap* is host time with no work (a late launch): it is executed as a compute segment and then
removed from the observed graph, so the run is slower than its recorded work. Every case carries
the class it injects; :func:`cases` gives five or more per class.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from prism.graph.records import CommOp, Graph, GroupInfo, Node, NodeKind, RankSummary
from prism.graph.simulate import simulate, timed_graph

__all__ = ["Program", "Case", "cases", "execute"]

_GAP = "<launch gap>"
MS = 1_000_000


@dataclass
class Program:
    """A job's per-rank programs under construction (durations in ns)."""

    world_size: int
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    nodes: dict[int, list[Node]] = field(default_factory=dict)
    _seq: dict[tuple, int] = field(default_factory=dict)
    _step: dict[int, int] = field(default_factory=dict)

    def group(self, gid: str, ranks, desc: str = "") -> str:
        self.groups[gid] = GroupInfo(gid, tuple(ranks), desc)
        return gid

    def _add(self, rank: int, **kw) -> int:
        lst = self.nodes.setdefault(rank, [])
        lst.append(Node(rank=rank, index=len(lst), step=self._step.get(rank, 0), **kw))
        return len(lst) - 1

    def compute(self, rank: int, ns: int) -> int:
        return self._add(rank, kind=NodeKind.COMPUTE, duration_ns=int(ns))

    def gap(self, rank: int, ns: int) -> int:
        return self._add(rank, kind=NodeKind.COMPUTE, duration_ns=int(ns), call_site=_GAP)

    def collective(self, rank: int, gid: str, op: CommOp, ns: int, *, size: int = 4096, is_async: bool = False) -> int:
        key = ("c", rank, gid)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        return self._add(rank, kind=NodeKind.COLLECTIVE, op=op, group_id=gid, seq=seq, size_bytes=size, dtype="f32",
                         shapes=((size // 4,),), reduce_op="sum" if op in (CommOp.ALL_REDUCE, CommOp.REDUCE_SCATTER) else "",
                         is_async=is_async, duration_ns=int(ns))

    def send(self, rank: int, dst: int, gid: str, ns: int, *, is_async: bool = True) -> int:
        key = ("s", rank, dst, gid)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        return self._add(rank, kind=NodeKind.SEND, op=CommOp.SEND, group_id=gid, seq=seq, peer=dst, size_bytes=16384,
                         dtype="f32", shapes=((4096,),), is_async=is_async, duration_ns=int(ns))

    def recv(self, rank: int, src: int, gid: str, ns: int, *, is_async: bool = True) -> int:
        key = ("r", src, rank, gid)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        return self._add(rank, kind=NodeKind.RECV, op=CommOp.RECV, group_id=gid, seq=seq, peer=src, size_bytes=16384,
                         dtype="f32", shapes=((4096,),), is_async=is_async, duration_ns=int(ns))

    def wait(self, rank: int, target: int) -> int:
        return self._add(rank, kind=NodeKind.WAIT, target=target)

    def step_end(self, rank: int) -> None:
        self._add(rank, kind=NodeKind.MARK, mark="step_end")
        self._step[rank] = self._step.get(rank, 0) + 1

    def graph(self) -> Graph:
        return Graph(world_size=self.world_size, nodes={r: tuple(ns) for r, ns in sorted(self.nodes.items())},
                     groups=dict(self.groups), kind="bare", job_name="inject")


def execute(program: Program) -> Graph:
    """Run the program through the discrete-event pass; return what a recording would hold: the
    observed times on one clock, step times, and no trace of the launch gaps."""
    truth = program.graph()
    sim = simulate(truth)
    timed = timed_graph(truth, sim)
    nodes, summaries = {}, {}
    for r, ns in timed.nodes.items():
        keep = [n for n in ns if n.call_site != _GAP]
        new_index = {n.index: i for i, n in enumerate(keep)}
        nodes[r] = tuple(dataclasses.replace(n, index=new_index[n.index],
                                             target=new_index[n.target] if n.kind is NodeKind.WAIT else -1)
                         for n in keep)
        summaries[r] = RankSummary(rank=r, step_times_ns=sim.ranks[r].step_times_ns)
    return dataclasses.replace(timed, nodes=nodes, summaries=summaries, kind="real", meta={"clock": "shared"})


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    injected: str
    """The class the case injects: R1, R2, R3, H1 or H2."""
    graph: Graph
    peers: dict[int, tuple[int, ...]]


def _jitter(rng: random.Random, ns: float) -> int:
    return int(ns * (1 + rng.uniform(-0.02, 0.02)))


def _data_parallel(dp: int, layers: int, fwd_ms: float, bwd_ms: float, ar_ms: float, *, steps: int = 3,
                   seed: int = 0, slow: dict[int, float] | None = None, gaps_ms: float = 0.0,
                   gap_ranks: tuple[int, ...] = (), sync_grads: bool = False) -> Program:
    """DDP-like: forward, backward with one async gradient all_reduce per layer (bucket), waits
    before the optimizer. ``slow``: rank -> compute factor; ``gaps_ms``: a launch gap before every
    backward layer on ``gap_ranks``; ``sync_grads``: the program blocks on each bucket."""
    rng = random.Random(seed)
    p = Program(dp)
    g = p.group("dp", range(dp), "dp")
    for _ in range(steps):
        for r in range(dp):
            f = (slow or {}).get(r, 1.0)
            for _ in range(layers):
                p.compute(r, _jitter(rng, fwd_ms * MS * f))
            pending = []
            for _ in range(layers):
                if r in gap_ranks:
                    p.gap(r, gaps_ms * MS)
                p.compute(r, _jitter(rng, bwd_ms * MS * f))
                pending.append(p.collective(r, g, CommOp.ALL_REDUCE, ar_ms * MS, size=1 << 20, is_async=not sync_grads))
            if not sync_grads:
                for i in pending:
                    p.wait(r, i)
            p.compute(r, _jitter(rng, 0.5 * MS * f))
            p.step_end(r)
    return p


def _fsdp(dp: int, layers: int, fwd_ms: float, bwd_ms: float, ag_ms: float, rs_ms: float, *, steps: int = 3,
          seed: int = 0, shared_lane: bool = False) -> Program:
    """FSDP-like: each layer's all_gather (unshard) is prefetched one layer ahead; backward
    reduce-scatters each layer's gradient. ``shared_lane``: the prefetch all_gather is issued
    after the reduce-scatter on the same group (one queue), so it waits behind it."""
    rng = random.Random(seed)
    p = Program(dp)
    ag = p.group("ag", range(dp), "dp_shard")
    rs = ag if shared_lane else p.group("rs", range(dp), "dp_shard")
    for _ in range(steps):
        for r in range(dp):
            nxt = p.collective(r, ag, CommOp.ALL_GATHER, ag_ms * MS, is_async=True)
            for i in range(layers):
                cur = nxt
                if i + 1 < layers:
                    nxt = p.collective(r, ag, CommOp.ALL_GATHER, ag_ms * MS, is_async=True)
                p.wait(r, cur)
                p.compute(r, _jitter(rng, fwd_ms * MS))
            nxt = p.collective(r, ag, CommOp.ALL_GATHER, ag_ms * MS, is_async=True)
            pending = []
            for i in range(layers):
                cur = nxt
                p.wait(r, cur)
                p.compute(r, _jitter(rng, bwd_ms * MS))
                pending.append(p.collective(r, rs, CommOp.REDUCE_SCATTER, rs_ms * MS, is_async=True))
                if i + 1 < layers:
                    nxt = p.collective(r, ag, CommOp.ALL_GATHER, ag_ms * MS, is_async=True)
            for i in pending:
                p.wait(r, i)
            p.compute(r, _jitter(rng, 0.5 * MS))
            p.step_end(r)
    return p


def _pipeline(stages: int, micro: int, fwd_ms: float, bwd_ms: float, *, dp: int = 1, schedule: str = "gpipe",
              steps: int = 3, seed: int = 0, p2p_ms: float = 0.05) -> Program:
    """Pipeline of ``stages`` (rank = stage * dp + replica), GPipe or 1F1B, then a DP all_reduce."""
    rng = random.Random(seed)
    p = Program(stages * dp)
    pg = p.group("pp", range(stages * dp), "pp")
    dgs = [p.group(f"dp{s}", [s * dp + d for d in range(dp)], "dp") for s in range(stages)] if dp > 1 else []
    for _ in range(steps):
        for s in range(stages):
            for d in range(dp):
                r = s * dp + d
                prev, nxt = r - dp, r + dp

                def fwd(m: int) -> None:
                    if s > 0:
                        p.wait(r, p.recv(r, prev, pg, p2p_ms * MS))
                    p.compute(r, _jitter(rng, fwd_ms * MS))
                    if s < stages - 1:
                        p.wait(r, p.send(r, nxt, pg, p2p_ms * MS))

                def bwd(m: int) -> None:
                    if s < stages - 1:
                        p.wait(r, p.recv(r, nxt, pg, p2p_ms * MS))
                    p.compute(r, _jitter(rng, bwd_ms * MS))
                    if s > 0:
                        p.wait(r, p.send(r, prev, pg, p2p_ms * MS))

                if schedule == "gpipe":
                    order = [("f", m) for m in range(micro)] + [("b", m) for m in range(micro)]
                else:  # 1F1B
                    warm = min(stages - s - 1, micro)
                    order = [("f", m) for m in range(warm)]
                    for m in range(micro - warm):
                        order += [("f", warm + m), ("b", m)]
                    order += [("b", m) for m in range(micro - warm, micro)]
                for what, m in order:
                    (fwd if what == "f" else bwd)(m)
                if dp > 1:
                    p.collective(r, dgs[s], CommOp.ALL_REDUCE, 0.2 * MS, size=1 << 18)
                p.compute(r, _jitter(rng, 0.5 * MS))
                p.step_end(r)
    return p


def _dp_peers(world: int, dp: int) -> dict[int, tuple[int, ...]]:
    """rank = stage * dp + replica: the replicas of a stage are peers."""
    return {r: tuple(range(r - r % dp, r - r % dp + dp)) for r in range(world)}


def cases() -> Iterator[Case]:
    """The injection suite: six cases of each class, over DDP-, FSDP- and pipeline-shaped jobs."""
    def case(name, injected, program, dp):
        return Case(name, injected, execute(program), _dp_peers(program.world_size, dp))

    # R1: late launches (host pacing) before backward layers, on all or some ranks.
    for i, (dp, layers, gap, who) in enumerate([(2, 4, 3.0, (0, 1)), (4, 6, 2.0, (0, 1, 2, 3)), (2, 8, 1.5, (1,)),
                                                (4, 4, 4.0, (2,)), (2, 5, 2.5, (0,)), (8, 4, 2.0, tuple(range(8)))]):
        yield case(f"R1-ddp{dp}x{layers}-gap{gap}ms", "R1",
                   _data_parallel(dp, layers, 4, 8, 1, seed=i, gaps_ms=gap, gap_ranks=who), dp)
    # R2: a prefetch all_gather queued behind a large reduce-scatter; gradients waited synchronously.
    for i, (layers, rs) in enumerate([(4, 6.0), (6, 5.0), (8, 8.0)]):
        yield case(f"R2-fsdp-sharedlane-{layers}l-rs{rs}ms", "R2",
                   _fsdp(2, layers, 4, 8, 1.0, rs, seed=10 + i, shared_lane=True), 2)
    for i, (dp, layers, ar) in enumerate([(2, 4, 4.0), (4, 6, 3.0), (2, 8, 5.0)]):
        yield case(f"R2-ddp{dp}-syncgrads-ar{ar}ms", "R2",
                   _data_parallel(dp, layers, 4, 8, ar, seed=20 + i, sync_grads=True), dp)
    # R3: one slow replica.
    for i, (dp, layers, who, factor) in enumerate([(2, 4, 1, 1.5), (4, 6, 3, 1.3), (2, 8, 0, 2.0),
                                                   (8, 4, 5, 1.4), (4, 4, 0, 1.6)]):
        yield case(f"R3-ddp{dp}-rank{who}x{factor}", "R3",
                   _data_parallel(dp, layers, 4, 8, 1, seed=30 + i, slow={who: factor}), dp)
    yield case("R3-pp2dp2-rank1x1.8", "R3", _slow_pipeline_replica(), 2)
    # H1: pipeline bubbles.
    for i, (stages, micro, sched, dp) in enumerate([(4, 4, "gpipe", 1), (4, 8, "1f1b", 1), (2, 2, "gpipe", 2),
                                                    (8, 8, "1f1b", 1), (4, 6, "1f1b", 2), (3, 3, "gpipe", 1)]):
        yield case(f"H1-pp{stages}-mb{micro}-{sched}-dp{dp}", "H1",
                   _pipeline(stages, micro, 4, 8, dp=dp, schedule=sched, seed=40 + i), dp)
    # H2: comm bigger than the independent work that could hide it.
    for i, (dp, layers, ar) in enumerate([(2, 4, 20.0), (4, 6, 14.0), (8, 4, 25.0)]):
        yield case(f"H2-ddp{dp}-ar{ar}ms", "H2", _data_parallel(dp, layers, 4, 8, ar, seed=50 + i), dp)
    for i, (layers, ag) in enumerate([(4, 16.0), (6, 12.0), (8, 20.0)]):
        yield case(f"H2-fsdp-ag{ag}ms", "H2", _fsdp(2, layers, 4, 8, ag, 1.0, seed=60 + i), 2)


def _slow_pipeline_replica() -> Program:
    """pp 2 × dp 2 where replica 1's compute is 1.8× slower (a straggler in a pipeline job)."""
    p = _pipeline(2, 8, 4, 8, dp=2, schedule="1f1b", seed=70)
    for r in (1, 3):
        p.nodes[r] = [dataclasses.replace(n, duration_ns=int(n.duration_ns * 1.8))
                      if n.kind is NodeKind.COMPUTE else n for n in p.nodes[r]]
    return p
