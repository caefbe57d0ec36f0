"""The gap classifier as a specification: small graphs stated inline, where every model's step
time can be worked out by hand, and the fault-injection suite (docs/analyze.md)."""

import collections

import pytest

from prism.analysis import CLASSES, analyze_graph
from prism.analysis.gaps import _BAL, _FREE, _LB, _NOQ, _PROG
from prism.analysis.inject import MS, Program, cases, execute
from prism.analysis.model import build_step_model, measure_work, step_nodes
from prism.graph import parse_graph
from prism.graph.records import CommOp
from tests.graph.conftest import load_asset

pytestmark = pytest.mark.timeout(60)

# Rank 1 computes 250 ns where its replica needs 100: rank 0 waits 150 ns in the all-reduce.
SKEW = """
graph world_size=2 kind=real job_name=skew
meta clock=shared
group 0 ranks=0,1 desc=dp
r0#0 COMP step=0 t=0+100
r0#1 COLL all_reduce g0:0 4MiB f32[1048576] sum step=0 t=100+160
r0#2 MARK step_end step=0 t=260+0
r1#0 COMP step=0 t=0+250
r1#1 COLL all_reduce g0:0 4MiB f32[1048576] sum step=0 t=250+10
r1#2 MARK step_end step=0 t=260+0
summary r0 step_times_ns=260
summary r1 step_times_ns=260
"""


def test_a_slow_replica_is_cross_rank_skew_and_the_bound_uses_its_fastest_peer():
    report = analyze_graph(parse_graph(SKEW))
    (step,) = report.steps
    assert step.observed_ns == 260
    assert step.lower_bound_ns == 110  # 100 ns of balanced compute, then the 10 ns transfer
    assert step.classes_ns == {"R1": 0, "R2": 0, "R3": 150, "H1": 0, "H2": 10}
    assert step.verdict == "R3" and report.verdict == "R3"
    assert [(link.what, link.duration_ns) for link in step.chain] == [("compute", 100), ("collective", 10)]
    assert step.gap_ns == 150


def test_a_pipeline_bubble_is_a_structural_orphan():
    # GPipe, 2 stages x 2 microbatches, forward 100 ns, backward 200 ns, messages 10 ns.
    program = load_asset("pipeline_2stage")
    p = Program(2, groups=dict(program.groups), nodes={r: list(ns) for r, ns in program.nodes.items()})
    report = analyze_graph(execute(p))
    (step,) = report.steps
    assert step.work_ns == 600
    # free comm: stage 1 runs F0 B0 F1 B1 from t=100; stage 0's B1 ends at 900
    assert step.model_ns["free"] == 900
    assert step.classes_ns["H1"] == 300
    assert step.verdict == "H1"
    # the stages block on their sends (sync), which only the step end needs: 10 ns of R2
    assert step.classes_ns["R2"] == 10 and step.lower_bound_ns == step.observed_ns - 10
    assert {link.rank for link in step.chain if link.what == "compute"} == {0, 1}


def test_launch_gaps_are_late_launches_of_their_size():
    p = Program(2)
    g = p.group("0", (0, 1), "dp")
    for r in (0, 1):
        p.compute(r, 10 * MS)
        if r == 1:
            p.gap(r, 4 * MS)  # the host launched the all-reduce 4 ms late
        p.collective(r, g, CommOp.ALL_REDUCE, 1 * MS)
        p.compute(r, 10 * MS)
        p.step_end(r)
    (step,) = analyze_graph(execute(p)).steps
    assert step.observed_ns == 25 * MS
    assert step.classes_ns["R1"] == 4 * MS
    # the gradient all-reduce is needed only by the optimizer: the bound overlaps it with compute
    assert step.lower_bound_ns == 20 * MS and step.classes_ns["R2"] == 1 * MS
    assert step.verdict == "R1"


def test_a_critical_op_queued_behind_a_large_one_is_queue_serialization():
    # both ranks issue a 20 ms async all_reduce, then a 1 ms all_reduce the next compute needs,
    # on the same group: the small one waits 20 ms in the queue.
    p = Program(2)
    g = p.group("0", (0, 1), "mesh_tp")
    for r in (0, 1):
        p.compute(r, 5 * MS)
        big = p.collective(r, g, CommOp.ALL_REDUCE, 20 * MS, is_async=True)
        p.collective(r, g, CommOp.ALL_REDUCE, 1 * MS)
        p.compute(r, 30 * MS)
        p.wait(r, big)
        p.step_end(r)
    (step,) = analyze_graph(execute(p)).steps
    assert step.observed_ns == 56 * MS
    assert step.lower_bound_ns == 36 * MS
    assert step.classes_ns["R2"] == 20 * MS and step.verdict == "R2"


def test_comm_larger_than_the_work_that_hides_it_is_budget_insufficient():
    # four 10 ms gradient buckets, released every 2 ms of backward: one lane cannot hide them.
    p = Program(2)
    g = p.group("0", (0, 1), "dp")
    for r in (0, 1):
        pending = []
        for _ in range(4):
            p.compute(r, 2 * MS)
            pending.append(p.collective(r, g, CommOp.ALL_REDUCE, 10 * MS, is_async=True))
        for i in pending:
            p.wait(r, i)
        p.step_end(r)
    (step,) = analyze_graph(execute(p)).steps
    # the lane bound: the first bucket is released at 2 ms, the four run back to back
    assert step.lower_bound_ns == 42 * MS == step.observed_ns
    assert step.classes_ns["H2"] == 34 * MS and step.verdict == "H2"
    assert [link.what for link in step.chain] == ["collective"] * 4


def test_every_model_only_removes_time():
    for case in cases():
        work = measure_work(case.graph)
        for k in (1, 2):
            nodes = step_nodes(case.graph, k)
            times = [build_step_model(nodes, work, v, peers=case.peers, gradient_groups=frozenset(
                g for g in case.graph.groups if case.graph.groups[g].desc == "dp")).schedule(
                lane_bound=not v.serialize_lanes).total_ns for v in (_PROG, _NOQ, _BAL, _LB, _FREE)]
            assert times == sorted(times, reverse=True), case.name


def test_fault_injection_confusion_matrix_is_at_least_90_percent_diagonal():
    confusion = collections.Counter()
    per_class = collections.Counter()
    for case in cases():
        report = analyze_graph(case.graph, peers=case.peers, skip_steps=1)
        confusion[(case.injected, report.verdict)] += 1
        per_class[case.injected] += 1
    assert all(per_class[c] >= 5 for c in CLASSES)
    diagonal = sum(confusion[(c, c)] for c in CLASSES)
    assert diagonal / sum(per_class.values()) >= 0.9, confusion


def test_the_binding_chain_names_its_nodes_for_the_gantt_chart(tmp_path):
    from prism.analysis.gantt import write_gantt

    graph = parse_graph(SKEW)
    (step,) = analyze_graph(graph).steps
    # the balanced bound runs through rank 0's compute (or its peer's) and the all-reduce's members
    assert set(step.chain_nodes) >= {(0, 1), (1, 1)}
    png = write_gantt(graph, 0, tmp_path / "g.png", t_lb_ns=step.lower_bound_ns, highlight=frozenset(step.chain_nodes))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
