"""The timed co-simulation clock: when a virtual rank issues its ops, given the timed graph and the
real times at which its exchanges with the sandbox completed (pure arithmetic, then real time)."""

import math
import threading
import time

import pytest

from prism.graph.text import parse_graph
from prism.vrank_replayer.clock import TimedClock, VrankSchedule, op_key

pytestmark = pytest.mark.timeout(30)

# Rank 0 is virtual, rank 1 is the sandbox. Predicted: rank 0 sends an activation at 100, waits
# for the gradient from 110 to 300 (rank 1 computes 110..290 and sends it), computes 50 and
# sends the next activation at 350. Times in ns.
TIMED = """
graph world_size=2 kind=timed
group 0 ranks=0,1 desc=pp
r0#0 COMP step=0 t=0+100
r0#1 SEND g0:0 ->1 16B f32[4] async step=0 t=100+10
r0#2 RECV g0:0 <-1 16B f32[4] async step=0 t=110+190
r0#3 WAIT #2 step=0 t=110+190
r0#4 COMP step=0 t=300+50
r0#5 SEND g0:1 ->1 16B f32[4] async step=0 t=350+10
r0#6 WAIT #5 step=0 t=360+0
r0#7 MARK step_end step=0 t=360+0
r1#0 RECV g0:0 <-0 16B f32[4] step=0 t=0+110
r1#1 COMP step=0 t=110+180
r1#2 SEND g0:0 ->0 16B f32[4] step=0 t=290+10
r1#3 RECV g0:1 <-0 16B f32[4] step=0 t=300+60
r1#4 MARK step_end step=0 t=360+0
"""


def sandbox_node(graph, index):
    """The clock is told about an op by the sandbox member's node (identities are shared)."""
    return graph.nodes[1][index]


def test_the_schedule_knows_issue_times_waits_and_blockers():
    g = parse_graph(TIMED)
    sched = VrankSchedule.from_nodes(0, g.nodes[0], sandbox={1})
    grad = sched.by_index[2]
    assert (grad.issue_ns, grad.end_ns, grad.wait_ns, grad.sure) == (110, 300, 110, True)
    nxt = sched.by_index[5]
    # the next activation may not leave before the gradient it waited for arrived
    assert (nxt.issue_ns, nxt.blockers, nxt.wait_ns) == (350, (2,), 360)
    assert sched.by_index[1].wait_ns == -1  # never waited for


def test_vranks_follow_the_sandbox_when_the_prediction_had_them_waiting_on_it():
    g = parse_graph(TIMED)
    clock = TimedClock(g, sandbox={1})
    first, grad, nxt = sandbox_node(g, 0), sandbox_node(g, 2), sandbox_node(g, 3)
    assert clock.issue_at_ns(0, first) == -math.inf  # before any real event: at once
    assert clock.blocked_on(0, nxt) == [2]
    # the gradient arrives at real 1,000,300: real = predicted + 1,000,000 from now on
    clock.complete_at(0, grad, 1_000_300)
    assert clock.blocked_on(0, nxt) == []
    assert clock.issue_at_ns(0, nxt) == 1_000_350
    # the sandbox rank is 100 ns late next time: the vrank is 100 ns late after it
    clock.complete_at(0, grad, 1_000_400)
    assert clock.issue_at_ns(0, nxt) == 1_000_450
    # and 100 ns early: the vrank, which was waiting for it, goes on 100 ns early
    clock.complete_at(0, grad, 1_000_300)
    assert clock.issue_at_ns(0, nxt) == 1_000_350


def test_an_op_the_vrank_did_not_wait_for_in_the_prediction_only_delays_it_when_late():
    g = parse_graph(TIMED)
    clock = TimedClock(g, sandbox={1})
    clock.complete_at(0, sandbox_node(g, 2), 1_000_300)  # offset 1,000,000
    act = sandbox_node(g, 3)  # predicted done at 360, waited for at 360: no predicted wait
    clock.complete_at(0, act, 1_000_355)  # early: the vrank reaches its wait at 1,000,360 anyway
    assert clock.offset_ns(0) == 1_000_000
    clock.complete_at(0, act, 1_000_500)  # 140 ns late: the vrank leaves its wait 140 ns late
    assert clock.offset_ns(0) == 1_000_140


def test_wait_until_issue_holds_the_vrank_until_its_predicted_time_in_real_time():
    ms = 1_000_000
    g = parse_graph("\n".join(_scale(line, ms) for line in TIMED.strip().splitlines()))
    clock = TimedClock(g, sandbox={1})
    clock.on_complete(0, sandbox_node(g, 2))  # the gradient arrives now (predicted 300 ms)
    t0 = time.perf_counter()
    clock.wait_until_issue(0, sandbox_node(g, 3))  # predicted 50 ms later
    waited = time.perf_counter() - t0
    assert 0.045 <= waited < 0.5
    assert [e[2] for e in clock.events] == ["anchor", "complete", "issue"]
    assert clock.events[0][3] == clock.offset_ns(0)  # each re-anchoring leaves its new offset in the events


def test_a_vrank_thread_asks_to_be_woken_early_by_the_median_of_its_recent_wake_up_delays():
    # A real rank's own wake-up latency is in the calibrated durations; the replayer's would add to it.
    clock = TimedClock(parse_graph(TIMED), sandbox={1})
    assert clock.wake_lead_ns() == 0
    for late_ns in (300_000, 100_000, 200_000):
        clock._woke_late(late_ns)
    assert clock.wake_lead_ns() == 200_000
    clock._woke_late(50_000_000)  # one thread descheduled for 50 ms moves the median, not the mean
    assert clock.wake_lead_ns() == 250_000


def _scale(line: str, factor: int) -> str:
    if " t=" not in line:
        return line
    head, _, times = line.rpartition(" t=")
    start, _, dur = times.partition("+")
    return f"{head} t={int(start) * factor}+{int(dur) * factor}"


# Two steps, the first a warm-up: the recording's start-up work (allocation, first calls, a
# contended launch) made vrank 0's warm-up compute 5,000 ns, while the sandbox gets through its
# own warm-up at once. Step 1 is the steady state: 100 ns of compute, then a message.
WARMUP = """
graph world_size=2 kind=timed
group 0 ranks=0,1 desc=pp
r0#0 SEND g0:0 ->1 16B f32[4] step=0 t=0+10
r0#1 COMP step=0 t=10+5000
r0#2 RECV g0:1 <-1 16B f32[4] step=0 t=5010+190
r0#3 MARK step_end step=0 t=5200+0
r0#4 COMP step=1 t=5200+100
r0#5 SEND g0:2 ->1 16B f32[4] step=1 t=5300+10
r0#6 MARK step_end step=1 t=5310+0
r1#0 RECV g0:0 <-0 16B f32[4] step=0 t=0+10
r1#1 COMP step=0 t=10+5180
r1#2 SEND g0:1 ->0 16B f32[4] step=0 t=5190+10
r1#3 MARK step_end step=0 t=5200+0
r1#4 RECV g0:2 <-0 16B f32[4] step=1 t=5200+110
r1#5 MARK step_end step=1 t=5310+0
"""


# With two warm-up steps only the first is paced: step 1 is played on the timed clock, so that
# sandbox ranks that each got through step 0 at their own pace settle into the timed graph's phase
# before the measured steps (with both paced, step 1's op would go at once, -inf).
@pytest.mark.parametrize("warmup_steps, step1_issue", [(0, 1_005_110), (1, 1_000_400), (2, 1_000_400)])
def test_through_the_warmup_steps_vranks_keep_the_sandbox_pace(warmup_steps, step1_issue):
    g = parse_graph(WARMUP)
    clock = TimedClock(g, sandbox={1}, warmup_steps=warmup_steps)
    first, reply, steady = sandbox_node(g, 0), sandbox_node(g, 2), sandbox_node(g, 4)
    clock.complete_at(0, first, 1_000_010)  # the first exchange anchors the vrank: offset 1,000,000
    assert clock.offset_ns(0) == 1_000_000
    # the sandbox's reply comes 290 ns later, long before the 5,000 ns the recording's warm-up took
    if warmup_steps:
        assert clock.issue_at_ns(0, reply) == -math.inf  # warm-up ops go at once
    clock.complete_at(0, reply, 1_000_300)
    # without the rule the vrank would still be in its recorded warm-up and hold the sandbox's
    # first measured step back by ~4,700 ns; with it, the measured step starts where the warm-up
    # released the vrank (1,000,300) and its op comes after its 100 ns of compute
    assert clock.issue_at_ns(0, steady) == step1_issue
    if warmup_steps:
        # ... and anchors it: an op the vrank waits for completes for real in the measured step
        clock.complete_at(0, steady, 1_000_500)
        assert clock.offset_ns(0) == 1_000_500 - 5310  # released at its predicted end, 5,310
        assert clock.issue_at_ns(0, steady) == 5300 + 995_190  # timed again from here on


# Sandbox ranks 2 and 3; vrank 0 all-reduces with sandbox 2 (tp, group 0), then with sandbox 3
# (dp, group 1), each synchronous, so its dp all-reduce may not go before the tp one completed.
# Each group is served by its own channel thread of the replayer, which only announces the tp op
# when it reaches it: before session 7 the dp thread could issue vrank 0's dp part first, and
# sandbox 3 then ran ahead of sandbox 2 by the whole of sandbox 2's start-up.
TWO_GROUPS = """
graph world_size=4 kind=timed
group 0 ranks=0,2 desc=tp
group 1 ranks=0,1,3 desc=dp
r0#0 COLL all_reduce g0:0 16B f32[4] step=0 t=0+100
r0#1 COLL all_reduce g1:0 16B f32[4] step=0 t=100+100
r0#2 MARK step_end step=0 t=200+0
r1#0 COLL all_reduce g1:0 16B f32[4] step=0 t=100+100
r1#1 MARK step_end step=0 t=200+0
r2#0 COLL all_reduce g0:0 16B f32[4] step=0 t=0+100
r2#1 MARK step_end step=0 t=200+0
r3#0 COLL all_reduce g1:0 16B f32[4] step=0 t=100+100
r3#1 MARK step_end step=0 t=200+0
"""


@pytest.mark.parametrize("told", [False, True])
def test_a_vrank_waits_for_its_earlier_collectives_with_the_sandbox_that_no_channel_reached_yet(told):
    g = parse_graph(TWO_GROUPS)
    served = {op_key(g.nodes[2][0]), op_key(g.nodes[3][0])}
    clock = TimedClock(g, sandbox={2, 3}, served=served, collectives_told=told)
    tp, dp = g.nodes[2][0], g.nodes[3][0]
    # the tp channel has not reached its op yet: only a told clock knows vrank 0 waits for it
    assert clock.blocked_on(0, dp) == ([0] if told else [])
    clock.complete_at(0, tp, 1_000)
    assert clock.blocked_on(0, dp) == []
    # where vrank 0 is pruned from the tp op, the replayer marks the op done: released, not re-anchored
    clock2 = TimedClock(g, sandbox={2, 3}, served=served, collectives_told=told)
    clock2.collective_done(tp)
    assert clock2.blocked_on(0, dp) == [] and clock2.offset_ns(0) is None  # no re-anchoring


def test_only_served_collectives_are_sure():
    g = parse_graph(TWO_GROUPS)
    dp_only = {op_key(g.nodes[3][0])}  # another replayer serves the tp group
    clock = TimedClock(g, sandbox={2, 3}, served=dp_only, vranks=[0, 1], collectives_told=True)
    assert clock.blocked_on(0, g.nodes[3][0]) == []


# Vrank 0 all-reduces with sandbox 2 (group 0), vrank 1 with sandbox 3 (group 1), twice, 300 ms
# apart. Each group's ops are served by its own channel thread of the replayer.
PAIRS = """
graph world_size=4 kind=timed
group 0 ranks=0,2 desc=tp
group 1 ranks=1,3 desc=tp
r0#0 COLL all_reduce g0:0 16B f32[4] step=0 t=0+100
r0#1 MARK step_end step=0 t=500+0
r1#0 COLL all_reduce g1:0 16B f32[4] step=0 t=0+100
r1#1 COMP step=0 t=100+300
r1#2 COLL all_reduce g1:1 16B f32[4] step=0 t=400+100
r1#3 MARK step_end step=0 t=500+0
r2#0 COLL all_reduce g0:0 16B f32[4] step=0 t=0+100
r2#1 MARK step_end step=0 t=500+0
r3#0 COLL all_reduce g1:0 16B f32[4] step=0 t=0+100
r3#1 COMP step=0 t=100+300
r3#2 COLL all_reduce g1:1 16B f32[4] step=0 t=400+100
r3#3 MARK step_end step=0 t=500+0
"""


@pytest.mark.parametrize("done_group, woken", [(0, False), (1, True)])
def test_a_finished_collective_wakes_only_the_threads_of_its_groups_vranks(done_group, woken):
    # The replayer's channel threads share one GIL: a thread woken for nothing takes it from a
    # channel whose vrank is answering the sandbox at that moment.
    g = parse_graph("\n".join(_scale(line, 1_000_000) for line in PAIRS.strip().splitlines()))
    clock = TimedClock(g, sandbox={2, 3}, collectives_told=True)
    first, second = g.nodes[3][0], g.nodes[3][2]
    clock.on_complete(1, first)  # vrank 1's second all-reduce is due 300 ms from now
    waiter = threading.Thread(target=clock.wait_until_issue, args=(1, second))
    waiter.start()
    time.sleep(0.05)
    for _ in range(5):
        clock.collective_done(g.nodes[2 + done_group][0])
        time.sleep(0.01)
    waiter.join(timeout=5)
    assert not waiter.is_alive()
    assert (clock.idle_wakeups > 0) is woken
