"""Per-step gap verdicts (GapScope): a feasible lower bound T_lb and where the rest of the step goes.

Five models of the same step (:mod:`prism.analysis.model`), each one mechanism less than the one
before, give a chain of step times; every difference is one class of idle time::

    observed          the measured step (the slowest rank's)
    T_prog            as programmed: measured work, the host blocks where the program does,
                      comm queues serialized                          R1 = observed − T_prog
    T_noq             ... comm queues not serialized                  R2 ⊇ T_prog − T_noq
    T_bal             ... each compute segment at its fastest DP peer R3 = T_noq − T_bal
    T_lb              ... only the authored dependency rules          R2 ⊇ T_bal − T_lb
    T_free            ... transfers take no time                      H2 = T_lb − T_free
    W                 the busiest rank's (balanced) compute work      H1 = T_free − W

R1 late launch: the run was slower than its own work and program allow (host pacing, launch
gaps). R2 queue serialization: an op waited in a queue behind one it does not depend on (a comm
lane, or compute held behind a wait the algorithm does not need). R3 cross-rank skew: ranks
waited for a peer slower than the others at the same work. H2 budget insufficient: comm time
that the step's independent work cannot hide. H1 structural orphan: idle forced by the
dependencies alone, even with free comm (the pipeline bubble). ``observed − T_lb`` = R1+R2+R3 is
recoverable; T_lb = W + H1 + H2 is not. Each model only drops rules or shortens work, so every
difference is ≥ 0 except R1, where a model that is slower than the run (its estimate of the
transfers, gloo's rendezvous) shows as ``model_error_ns`` and R1 counts 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from prism.graph.records import Graph, Node, NodeKind

from .model import Item, Schedule, Variant, Work, balanced_compute, build_step_model, measure_work, step_nodes

__all__ = ["CLASSES", "CLASS_NAMES", "RECOVERABLE", "Link", "StepGap", "GapReport", "analyze_graph",
           "structural_peers", "gradient_groups"]

CLASSES = ("R1", "R2", "R3", "H1", "H2")
CLASS_NAMES = {"R1": "late launch", "R2": "queue serialization", "R3": "cross-rank skew",
               "H1": "structural orphan", "H2": "budget insufficient"}
RECOVERABLE = frozenset({"R1", "R2", "R3"})

_PROG = Variant(program_order=True, serialize_lanes=True)
_NOQ = Variant(program_order=True, serialize_lanes=False)
_BAL = Variant(program_order=True, serialize_lanes=False, balanced=True)
_LB = Variant(program_order=False, serialize_lanes=False, balanced=True)
_FREE = Variant(program_order=False, serialize_lanes=False, balanced=True, comm=False)


@dataclass(frozen=True, slots=True)
class Link:
    """One piece of the binding chain: a run of compute on a rank, or one transfer."""

    what: str
    """compute, collective or message."""
    rank: int
    duration_ns: int
    label: str
    count: int = 1

    def __str__(self) -> str:
        return f"{self.label} {self.duration_ns / 1e6:.2f} ms"


@dataclass(frozen=True, slots=True)
class StepGap:
    step: int
    observed_ns: int
    lower_bound_ns: int
    work_ns: int
    """The busiest rank's compute work (each segment at its fastest DP peer)."""
    classes_ns: dict[str, int]
    model_ns: dict[str, int]
    """Step time of each model: prog, noq, bal, lb, free."""
    model_error_ns: int
    """observed − T_prog when negative (the model is slower than the run), else 0."""
    chain: tuple[Link, ...]
    binding_rank: int
    chain_nodes: tuple[tuple[int, int], ...] = ()
    """(rank, index) of every node on the binding chain (a collective: each member's op; a
    message: its send)."""

    @property
    def gap_ns(self) -> int:
        """observed − T_lb: what could be won back."""
        return self.observed_ns - self.lower_bound_ns

    @property
    def verdict(self) -> str:
        return max(CLASSES, key=lambda c: (self.classes_ns[c], -CLASSES.index(c)))

    def to_json(self) -> dict:
        return {"step": self.step, "observed_ms": self.observed_ns / 1e6, "t_lb_ms": self.lower_bound_ns / 1e6,
                "gap_ms": self.gap_ns / 1e6, "work_ms": self.work_ns / 1e6, "verdict": self.verdict,
                "classes_ms": {c: v / 1e6 for c, v in self.classes_ns.items()},
                "models_ms": {k: v / 1e6 for k, v in self.model_ns.items()},
                "model_error_ms": self.model_error_ns / 1e6, "binding_rank": self.binding_rank,
                "binding_chain": [str(link) for link in self.chain]}


@dataclass(frozen=True, slots=True)
class GapReport:
    steps: tuple[StepGap, ...]
    peers: dict[int, tuple[int, ...]]
    gradient_groups: frozenset[str]

    def mean_ns(self, field: str) -> float:
        return statistics.fmean(getattr(s, field) for s in self.steps) if self.steps else 0.0

    def mean_classes_ns(self) -> dict[str, float]:
        return {c: statistics.fmean(s.classes_ns[c] for s in self.steps) if self.steps else 0.0 for c in CLASSES}

    @property
    def verdict(self) -> str:
        mean = self.mean_classes_ns()
        return max(CLASSES, key=lambda c: (mean[c], -CLASSES.index(c)))

    @property
    def largest_hard(self) -> str:
        """The larger of H1 and H2: what stays when everything recoverable is recovered."""
        mean = self.mean_classes_ns()
        return max(("H1", "H2"), key=lambda c: (mean[c], c == "H1"))

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "verdict_name": CLASS_NAMES[self.verdict],
                "largest_hard": self.largest_hard,
                "mean_observed_ms": self.mean_ns("observed_ns") / 1e6,
                "mean_t_lb_ms": self.mean_ns("lower_bound_ns") / 1e6,
                "mean_classes_ms": {c: v / 1e6 for c, v in self.mean_classes_ns().items()},
                "gradient_groups": sorted(self.gradient_groups),
                "steps": [s.to_json() for s in self.steps]}


def _shape(nodes: tuple[Node, ...]) -> tuple:
    return tuple((n.kind, n.op, n.size_bytes, n.shapes, n.dtype) for n in nodes if n.kind is not NodeKind.COMPUTE)


def structural_peers(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Ranks that run the same program (the same comm sequence but for groups and peers): the
    stand-in for DP replicas when the job's parallelism is unknown."""
    by_shape: dict[tuple, list[int]] = {}
    for r, nodes in sorted(graph.nodes.items()):
        by_shape.setdefault(_shape(nodes), []).append(r)
    return {r: tuple(rs) for rs in by_shape.values() for r in rs}


def gradient_groups(graph: Graph, peers: Mapping[int, tuple[int, ...]]) -> frozenset[str]:
    """Groups whose members are all DP peers of each other: their all_reduce / reduce_scatter is
    the gradient reduction (tensor-parallel groups, named ``tp`` by c10d, never are)."""
    out = set()
    for gid, g in graph.groups.items():
        if len(g.ranks) < 2 or "tp" in g.desc.lower().split("_"):
            continue
        first = set(peers.get(g.ranks[0], (g.ranks[0],)))
        if set(g.ranks) <= first:
            out.add(gid)
    return frozenset(out)


def _observed_steps(graph: Graph) -> dict[int, tuple[int, ...]]:
    out = {}
    for r, nodes in graph.nodes.items():
        s = graph.summaries.get(r)
        if s is not None and s.step_times_ns:
            out[r] = s.step_times_ns
            continue
        ends = [n.start_ns for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end"]
        if ends and all(t >= 0 for t in ends):
            out[r] = tuple(b - a for a, b in zip([min(n.start_ns for n in nodes if n.start_ns >= 0), *ends[:-1]], ends))
    return out


def _chain(items: tuple[Item, ...]) -> tuple[Link, ...]:
    links: list[Link] = []
    for it in items:
        if it.what == "compute":
            if links and links[-1].what == "compute" and links[-1].rank == it.rank:
                prev = links[-1]
                count = prev.count + 1
                links[-1] = Link("compute", it.rank, prev.duration_ns + it.duration_ns, f"r{it.rank} compute ×{count}", count)
            else:
                links.append(Link("compute", it.rank, it.duration_ns, f"r{it.rank} compute ×1"))
        elif it.what == "collective" and it.duration_ns > 0:
            n = it.node
            op = n.op.value if n.op else "collective"
            links.append(Link("collective", it.rank, it.duration_ns, f"{op} g{n.group_id}:{n.seq}"))
        elif it.what == "message" and it.duration_ns > 0:
            links.append(Link("message", it.rank, it.duration_ns, f"send r{it.rank}→r{it.peer}"))
    return tuple(links)


def _chain_nodes(items: tuple[Item, ...], nodes: Mapping[int, tuple[Node, ...]]) -> tuple[tuple[int, int], ...]:
    out: dict[tuple[int, int], None] = {}
    for it in items:
        n = it.node
        if n is None or it.what not in ("compute", "collective", "message"):
            continue
        if it.what == "collective":
            out.update(((m.rank, m.index), None) for ns in nodes.values() for m in ns
                       if m.kind is NodeKind.COLLECTIVE and (m.group_id, m.seq) == (n.group_id, n.seq))
        elif it.what == "message":
            # the send: a receive's span is mostly waiting, which is not the chain's work
            out.update(((m.rank, m.index), None) for m in nodes.get(it.rank, ())
                       if m.kind is NodeKind.SEND and (m.group_id, m.seq, m.peer) == (n.group_id, n.seq, it.peer))
        else:
            out[(n.rank, n.index)] = None
    return tuple(out)


def _step_gap(step: int, observed: int, nodes: Mapping[int, tuple[Node, ...]], work: Work,
              peers: Mapping[int, tuple[int, ...]], grads: frozenset[str]) -> StepGap:
    def run(v: Variant) -> Schedule:
        return build_step_model(nodes, work, v, peers=peers, gradient_groups=grads).schedule(
            lane_bound=not v.serialize_lanes)

    prog, noq, bal, lb, free = (run(v) for v in (_PROG, _NOQ, _BAL, _LB, _FREE))
    balanced = balanced_compute(nodes, work, peers)
    busy = {r: sum(balanced[(r, n.index)] for n in ns if n.kind is NodeKind.COMPUTE) for r, ns in nodes.items()}
    w = max(busy.values(), default=0)
    t = {"prog": prog.total_ns, "noq": noq.total_ns, "bal": bal.total_ns, "lb": lb.total_ns, "free": free.total_ns}
    classes = {
        "R1": max(0, observed - t["prog"]),
        "R2": (t["prog"] - t["noq"]) + (t["bal"] - t["lb"]),
        "R3": t["noq"] - t["bal"],
        "H2": t["lb"] - t["free"],
        "H1": t["free"] - w,
    }
    if lb.lane_bound_ns > lb.path_ns:
        binding = lb.lane[-1].rank
    else:
        binding = max(lb.step_ns, key=lambda r: (lb.step_ns[r], -r)) if lb.step_ns else -1
    return StepGap(step=step, observed_ns=observed, lower_bound_ns=t["lb"], work_ns=w,
                   classes_ns={c: classes[c] for c in CLASSES}, model_ns=t,
                   model_error_ns=min(0, observed - t["prog"]), chain=_chain(lb.chain), binding_rank=binding,
                   chain_nodes=_chain_nodes(lb.chain, nodes))


def analyze_graph(graph: Graph, *, peers: Mapping[int, tuple[int, ...]] | None = None, skip_steps: int = 0,
                  steps: tuple[int, ...] | None = None) -> GapReport:
    """Gap verdicts of every step of ``graph`` after ``skip_steps`` (or of ``steps``).

    ``peers``: each rank's DP replicas (itself included), e.g. from the job's parallelism;
    default :func:`structural_peers`. The graph needs observed times (a recording, a timed
    graph, an emulation).
    """
    peers = dict(peers) if peers is not None else structural_peers(graph)
    grads = gradient_groups(graph, peers)
    work = measure_work(graph)
    observed = _observed_steps(graph)
    num_steps = min((len(v) for v in observed.values()), default=0)
    wanted = steps if steps is not None else tuple(range(skip_steps, num_steps))
    out = []
    for k in wanted:
        if k >= num_steps:
            continue
        t_obs = max(v[k] for v in observed.values())
        out.append(_step_gap(k, t_obs, step_nodes(graph, k), work, peers, grads))
    return GapReport(tuple(out), peers, grads)
