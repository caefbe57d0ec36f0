"""simulate(graph): the DESIGN §7.2 timeline, checked against timelines computed by hand."""

from __future__ import annotations

import dataclasses
import time

import pytest

from prism.core.errors import GraphError
from prism.graph import (
    CommOp,
    Graph,
    GroupInfo,
    Node,
    NodeKind,
    StepRow,
    compare_steps,
    estimate_transfers,
    parse_graph,
    simulate,
    timed_graph,
)

pytestmark = pytest.mark.timeout(60)


def test_all_reduce_waits_for_the_late_rank(two_rank_all_reduce: Graph) -> None:
    # rank 1 computes 300 ns, rank 0 100 ns; the all_reduce transfer is the smaller recorded
    # duration (20 ns, rank 1 arrived last), so it runs 300..320 on both; then 10 ns of compute.
    sim = simulate(two_rank_all_reduce)
    r0, r1 = sim.ranks[0], sim.ranks[1]
    assert (r0.issue_ns[1], r0.start_ns[1], r0.end_ns[1]) == (100, 300, 320)
    assert (r1.issue_ns[1], r1.start_ns[1], r1.end_ns[1]) == (300, 300, 320)
    assert r0.step_end_ns == r1.step_end_ns == (330, 660)
    assert r0.step_times_ns == r1.step_times_ns == (330, 330)
    assert sim.total_ns == 660


def test_compare_steps_against_the_summary_and_the_marks(two_rank_all_reduce: Graph) -> None:
    sim = simulate(two_rank_all_reduce)
    assert compare_steps(two_rank_all_reduce, sim) == [
        StepRow(0, 0, 330, 330, "summary"),
        StepRow(0, 1, 330, 330, "summary"),
        StepRow(1, 0, 330, 330, "summary"),
        StepRow(1, 1, 330, 330, "summary"),
    ]
    # Without summaries the step_end MARKs' start_ns give the measurement; a slower measured
    # step shows up as a negative relative error of the prediction.
    marks_only = dataclasses.replace(two_rank_all_reduce, summaries={})
    nodes = dict(marks_only.nodes)
    nodes[1] = nodes[1][:7] + (dataclasses.replace(nodes[1][7], start_ns=990),)
    rows = compare_steps(dataclasses.replace(marks_only, nodes=nodes), sim)
    assert rows[2:] == [StepRow(1, 0, 330, 330, "marks"), StepRow(1, 1, 330, 660, "marks")]
    assert rows[3].rel_error == pytest.approx(-0.5)


def test_two_stage_pipeline(pipeline_2stage: Graph) -> None:
    # stage 0: F 0-100, send 100-110, F 110-210, send 210-220, recv grad 0 waits for stage 1's
    #   send (410-420), B 420-620, recv grad 1 waits for 720-730, B 730-930.
    # stage 1: recv act 0 at 110, F 110-210, B 210-410, send 410-420, recv act 1 (sent at 220)
    #   immediately at 420, F 420-520, B 520-720, send 720-730.
    sim = simulate(pipeline_2stage)
    assert sim.ranks[0].step_times_ns == (930,)
    assert sim.ranks[1].step_times_ns == (730,)
    assert (sim.ranks[0].issue_ns[4], sim.ranks[0].end_ns[4]) == (220, 420)
    assert (sim.ranks[1].issue_ns[0], sim.ranks[1].end_ns[0]) == (0, 110)
    assert sim.ranks[1].end_ns[4] == 420
    assert sim.total_ns == 930


def test_p2p_transfer_from_recv_timing_else_send_duration() -> None:
    g = parse_graph(
        """
        group 0 ranks=0,1
        r0#0 SEND g0:0 ->1 8B t=0+80
        r0#1 SEND g0:1 ->1 8B t=100+15
        r1#0 RECV g0:0 <-0 8B t=50+30
        r1#1 RECV g0:1 <-0 8B
        """
    )
    transfers = estimate_transfers(g)
    # recv ended at 80, measured from max(send start 0, recv start 50) = 30 ns of transfer
    assert transfers.message_ns == {(0, 1, "0", 0): 30, (0, 1, "0", 1): 15}
    sim = simulate(g)
    assert sim.ranks[0].end_ns == (30, 45)
    assert sim.ranks[1].end_ns == (30, 45)


LATE_RECEIVER = """
group 0 ranks=0,1
r0#0 SEND g0:0 ->1 8B d=10
r0#1 COMP d=5
r0#2 MARK step_end
r1#0 COMP d=50
r1#1 RECV g0:0 <-0 8B d=10
r1#2 MARK step_end
"""


def test_a_send_to_a_late_receiver_completes_at_once_if_eager_with_the_receive_at_a_rendezvous() -> None:
    g = parse_graph(LATE_RECEIVER)
    eager = simulate(g)
    assert eager.ranks[0].end_ns[0] == 10 and eager.ranks[0].step_times_ns == (15,)
    assert eager.ranks[1].end_ns[1] == 50
    # gloo: the transfer starts when the receiver posts (50) and takes its 10 ns on both sides
    rdv = simulate(dataclasses.replace(g, meta={"p2p": "rendezvous"}))
    assert (rdv.ranks[0].start_ns[0], rdv.ranks[0].end_ns[0]) == (50, 60)
    assert rdv.ranks[0].step_times_ns == (65,)
    assert (rdv.ranks[1].issue_ns[1], rdv.ranks[1].end_ns[1]) == (50, 60)


def test_sends_waited_before_either_side_receives_deadlock_at_a_rendezvous_only() -> None:
    # each rank isends and waits for it before it posts its receive: real gloo hangs here
    g = parse_graph("""
        group 0 ranks=0,1
        r0#0 SEND g0:0 ->1 8B async d=10
        r0#1 WAIT #0
        r0#2 RECV g0:0 <-1 8B d=10
        r1#0 SEND g0:0 ->0 8B async d=10
        r1#1 WAIT #0
        r1#2 RECV g0:0 <-0 8B d=10
        """)
    assert simulate(g).total_ns == 10  # eager: both messages left at 0 and arrived at 10
    with pytest.raises(GraphError, match=r"send ->1 g0:0, whose receive was never posted"):
        simulate(dataclasses.replace(g, meta={"p2p": "rendezvous"}))


ASYNC = """
group 0 ranks=0,1
r0#0 COMP d=100
r0#1 COLL all_reduce g0:0 f32[4] sum async d={d0}
r0#2 COMP d=300
r0#3 WAIT #1
r0#4 COMP d=50
r0#5 MARK step_end
r1#0 COMP d=100
r1#1 COLL all_reduce g0:0 f32[4] sum async d={d1}
r1#2 COMP d=300
r1#3 WAIT #1
r1#4 COMP d=50
r1#5 MARK step_end
"""


def test_async_collective_longer_than_the_overlapped_compute_is_exposed() -> None:
    # transfer min(500, 400) = 400: runs 100-500 beside compute 100-400; WAIT releases at 500
    sim = simulate(parse_graph(ASYNC.format(d0=500, d1=400)))
    assert sim.ranks[0].end_ns[1] == 500
    assert (sim.ranks[0].start_ns[3], sim.ranks[0].end_ns[3]) == (400, 500)
    assert sim.ranks[0].step_times_ns == sim.ranks[1].step_times_ns == (550,)


def test_async_collective_hidden_behind_compute() -> None:
    # transfer 200: done at 300, before the WAIT at 400, so the step is pure compute: 450
    sim = simulate(parse_graph(ASYNC.format(d0=200, d1=250)))
    assert sim.ranks[0].end_ns[1] == 300
    assert sim.ranks[0].step_times_ns == (450,)


def test_the_same_collective_synchronous_blocks_compute() -> None:
    sync = ASYNC.format(d0=400, d1=400).replace(" async", "")
    assert simulate(parse_graph(sync)).ranks[0].step_times_ns == (100 + 400 + 300 + 50,)


def test_unwaited_async_comm_must_finish_before_step_end() -> None:
    g = parse_graph(
        """
        group 0 ranks=0,1
        r0 COLL all_reduce g0:0 async d=1000
        r0 COMP d=100
        r0 MARK step_end
        r0 COMP d=100
        r0 MARK step_end
        r1 COLL all_reduce g0:0 async d=1000
        r1 COMP d=100
        r1 MARK step_end
        r1 COMP d=100
        r1 MARK step_end
        """
    )
    assert simulate(g).ranks[0].step_times_ns == (1000, 100)


def test_collectives_on_one_group_queue_on_its_lane_other_groups_run_beside() -> None:
    g = parse_graph(
        """
        group a ranks=0,1
        group b ranks=0,1
        r0 COLL all_reduce ga:0 async d=100
        r0 COLL all_reduce ga:1 async d=100
        r0 COLL all_gather gb:0 async d=100
        r0 MARK step_end
        r1 COLL all_reduce ga:0 async d=100
        r1 COLL all_reduce ga:1 async d=100
        r1 COLL all_gather gb:0 async d=100
        r1 MARK step_end
        """
    )
    r0 = simulate(g).ranks[0]
    assert r0.start_ns[:3] == (0, 100, 0)
    assert r0.end_ns[:3] == (100, 200, 100)
    assert r0.step_times_ns == (200,)


def test_an_async_collective_queued_behind_the_previous_one_is_not_counted_twice() -> None:
    # DDP's bucket all-reduces: issued 10 ns apart, each 100 ns on the wire, one after another on
    # the group. As recorded (issue to completion), the second took 190 and the third 280: they
    # include the queueing that the group's lane adds again. Each is done 100 after the one before,
    # as recorded; read as transfers of 190 and 280 they would end at 390 and 670.
    rank = """
        r{r} COLL all_reduce g0:0 async t=0+100
        r{r} COMP d=10
        r{r} COLL all_reduce g0:1 async t=10+190
        r{r} COMP d=10
        r{r} COLL all_reduce g0:2 async t=20+280
        r{r} COMP d=10
        r{r} MARK step_end
        """
    g = parse_graph("group 0 ranks=0,1\n" + rank.format(r=0) + rank.format(r=1))
    assert estimate_transfers(g).collective_ns == {("0", 0): 100, ("0", 1): 100, ("0", 2): 100}
    r0 = simulate(g).ranks[0]
    assert r0.end_ns[:5:2] == (100, 200, 300)
    assert r0.step_times_ns == (300,)


def test_unknown_durations_count_as_zero() -> None:
    g = parse_graph("group 0 ranks=0,1\nr0 COMP\nr0 COLL barrier g0:0\nr1 COMP d=7\nr1 COLL barrier g0:0\n")
    sim = simulate(g)
    assert sim.ranks[0].total_ns == sim.ranks[1].total_ns == 7


def test_mutual_recv_deadlock_names_each_stuck_rank() -> None:
    g = parse_graph(
        """
        group 0 ranks=0,1
        r0#0 RECV g0:0 <-1 8B
        r0#1 SEND g0:0 ->1 8B
        r1#0 RECV g0:0 <-0 8B
        r1#1 SEND g0:0 ->0 8B
        """
    )
    with pytest.raises(GraphError) as info:
        simulate(g)
    assert str(info.value) == (
        "deadlock: no rank can progress\n"
        "  rank 0 at r0#0 RECV g0:0 <-1 8B (t=0ns): waits for r0#0 recv <-1 g0:0, never sent "
        "(rank 1 stuck at r1#0 RECV g0:0 <-0 8B)\n"
        "  rank 1 at r1#0 RECV g0:0 <-0 8B (t=0ns): waits for r1#0 recv <-0 g0:0, never sent "
        "(rank 0 stuck at r0#0 RECV g0:0 <-1 8B)"
    )


def test_collective_a_rank_never_issues_is_a_deadlock() -> None:
    g = parse_graph("group 0 ranks=0,1\nr0#0 COLL all_reduce g0:0 f32[4]\nr1#0 COMP d=5\n")
    with pytest.raises(GraphError, match=r"rank 0 at r0#0 COLL all_reduce g0:0 f32\[4\] \(t=0ns\): waits for "
                       r"r0#0 all_reduce g0:0, not issued by rank\(s\) \[1\] \(rank 1 finished\)"):
        simulate(g)


def test_collectives_issued_in_different_orders_deadlock() -> None:
    g = parse_graph(
        """
        group 0 ranks=0,1
        r0 COLL all_reduce g0:0 async
        r0 COLL all_reduce g0:1 async
        r0 MARK step_end
        r1 COLL all_reduce g0:1 async
        r1 COLL all_reduce g0:0 async
        r1 MARK step_end
        """
    )
    with pytest.raises(GraphError, match=r"queued behind an earlier collective: rank 1's lane is held by g0:1"):
        simulate(g)


def test_timed_graph_is_a_fixed_point(two_rank_all_reduce: Graph, pipeline_2stage: Graph) -> None:
    for g in (two_rank_all_reduce, pipeline_2stage):
        sim = simulate(g)
        timed = timed_graph(g, sim)
        assert timed.kind == "timed"
        again = simulate(timed)
        assert {r: t.step_times_ns for r, t in again.ranks.items()} == {
            r: t.step_times_ns for r, t in sim.ranks.items()
        }


def _ring_job(world_size: int, num_steps: int) -> Graph:
    """Per step and rank: compute 1000, async all_reduce (recorded 300 + 10·rank, so the transfer
    is 300), compute 500, wait, async send to the next rank (50), recv from the previous, wait."""
    nodes = {}
    for r in range(world_size):
        out: list[Node] = []

        def add(kind: NodeKind, **kw: object) -> int:
            out.append(Node(r, len(out), kind, **kw))  # type: ignore[arg-type]
            return len(out) - 1

        for s in range(num_steps):
            add(NodeKind.COMPUTE, duration_ns=1000, step=s)
            ar = add(NodeKind.COLLECTIVE, op=CommOp.ALL_REDUCE, group_id="0", seq=s, is_async=True,
                     duration_ns=300 + 10 * r, step=s)
            add(NodeKind.COMPUTE, duration_ns=500, step=s)
            add(NodeKind.WAIT, target=ar, step=s)
            send = add(NodeKind.SEND, op=CommOp.SEND, group_id="0", seq=s, peer=(r + 1) % world_size,
                       is_async=True, duration_ns=50, step=s)
            add(NodeKind.RECV, op=CommOp.RECV, group_id="0", seq=s, peer=(r - 1) % world_size, step=s)
            add(NodeKind.WAIT, target=send, step=s)
            add(NodeKind.MARK, mark="step_end", step=s)
        nodes[r] = tuple(out)
    return Graph(world_size, nodes, {"0": GroupInfo("0", tuple(range(world_size)))})


def test_100k_nodes_simulate_in_seconds() -> None:
    # each step: 1000 compute, all_reduce 1000-1300 hidden behind compute to 1500, ring message
    # 1500-1550: every step takes 1550 ns on every rank
    g = _ring_job(world_size=8, num_steps=1600)
    assert sum(len(n) for n in g.nodes.values()) == 102_400
    began = time.perf_counter()
    sim = simulate(g)
    elapsed = time.perf_counter() - began
    assert elapsed < 10.0
    for r in range(8):
        assert sim.ranks[r].step_times_ns == (1550,) * 1600
    assert sim.total_ns == 1600 * 1550
