"""The co-simulation clock that follows a changed sandbox (docs/whatif.md): vranks are simulated
online from the timed graph; ops with the sandbox complete at reported real times."""

import threading
import time

import pytest

from prism.graph.livesim import LiveSim, op_key
from prism.graph.text import parse_graph
from prism.vrank_replayer.clock import CoSimClock

pytestmark = pytest.mark.timeout(30)

# Rank 1 is the sandbox. Vrank 0 waits for its message, computes 50 and sends to vrank 2 (transfer
# 10); vrank 2 computes 30 and answers the sandbox. Vrank 3 and vrank 4 only work with each other.
TIMED = """
graph world_size=5 kind=timed
group 0 ranks=0,1,2,3,4 desc=world
group 1 ranks=3,4 desc=pair
r0#0 RECV g0:0 <-1 16B f32[4] step=0 t=0+100
r0#1 COMP step=0 t=100+50
r0#2 SEND g0:0 ->2 16B f32[4] step=0 t=150+10
r0#3 MARK step_end step=0 t=160+0
r1#0 COMP step=0 t=0+90
r1#1 SEND g0:0 ->0 16B f32[4] step=0 t=90+10
r1#2 RECV g0:0 <-2 16B f32[4] step=0 t=100+90
r1#3 MARK step_end step=0 t=190+0
r2#0 RECV g0:0 <-0 16B f32[4] step=0 t=0+160
r2#1 COMP step=0 t=160+30
r2#2 SEND g0:0 ->1 16B f32[4] step=0 t=190+0
r2#3 MARK step_end step=0 t=190+0
r3#0 COMP step=0 t=0+20
r3#1 COLL all_reduce g1:0 16B f32[4] sum step=0 t=20+40
r3#2 COMP step=0 t=60+70
r3#3 COLL all_reduce g1:1 16B f32[4] sum step=0 t=130+5
r3#4 MARK step_end step=0 t=135+0
r4#0 COMP step=0 t=0+55
r4#1 COLL all_reduce g1:0 16B f32[4] sum step=0 t=55+5
r4#2 COMP step=0 t=60+40
r4#3 COLL all_reduce g1:1 16B f32[4] sum step=0 t=100+35
r4#4 MARK step_end step=0 t=135+0
"""


@pytest.mark.parametrize("arrives", [1_000_000, 1_000_500])
def test_vranks_downstream_of_the_sandbox_move_with_its_real_time(arrives):
    g = parse_graph(TIMED)
    sim = LiveSim(g, sandbox={1})
    to_sandbox = op_key(g.nodes[2][2])
    assert sim.issue_ns(2, to_sandbox) is None  # it depends on the sandbox's message, not there yet
    sim.report(0, op_key(g.nodes[1][1]), arrives)
    # 0 gets the message, computes 50, sends (10) to 2, which computes 30: +90 after the arrival,
    # whether the sandbox is early or late against the timed graph's 100
    assert sim.issue_ns(2, to_sandbox) == arrives + 90


def test_vranks_that_do_not_depend_on_the_sandbox_keep_their_calibrated_pace():
    sim = LiveSim(parse_graph(TIMED), sandbox={1})
    # 3 and 4 never wait on the sandbox: the pass runs them to the end with the timed durations
    # (the first compute is start-up and counts nothing; then 4 waits at the all_reduce lane)
    assert sim.done[3] == sim.done[4] == 5 + 70 + 5
    assert 0 not in sim.done and 2 not in sim.done


def test_the_clock_releases_a_vrank_at_its_simulated_time():
    g = parse_graph(TIMED)
    clock = CoSimClock(g, sandbox={1}, timeout_s=10)
    to_sandbox = g.nodes[1][2]  # the sandbox's node of the message 2 -> 1
    released = []
    t = threading.Thread(target=lambda: (clock.wait_until_issue(2, to_sandbox), released.append(time.perf_counter_ns())))
    t.start()
    time.sleep(0.05)
    assert not released  # blocked: vrank 0 has not heard from the sandbox
    now = time.perf_counter_ns()
    clock.complete_at(0, g.nodes[1][1], now + 100_000_000 - 90)  # the message "arrives" in 100 ms
    t.join(timeout=5)
    assert released and released[0] >= now + 100_000_000 - 2_000_000  # not before its time (minus the wake lead)


# Ranks 0, 2 and 3 are vranks of a world all_reduce with the sandbox rank 1; vrank 0 is played by
# the replayer (it neighbors the sandbox), 2 and 3 are pruned. Vrank 3 computes 100 before it.
COLL = """
graph world_size=4 kind=timed
group 0 ranks=0,1,2,3 desc=world
r0#0 COLL all_reduce g0:0 16B f32[4] sum step=0 t=0+10
r0#1 COMP step=0 t=10+20
r0#2 COLL all_reduce g0:1 16B f32[4] sum step=0 t=30+100
r1#0 COLL all_reduce g0:0 16B f32[4] sum step=0 t=0+10
r1#1 COMP step=0 t=10+20
r1#2 COLL all_reduce g0:1 16B f32[4] sum step=0 t=30+100
r2#0 COLL all_reduce g0:0 16B f32[4] sum step=0 t=0+10
r2#1 COMP step=0 t=10+20
r2#2 COLL all_reduce g0:1 16B f32[4] sum step=0 t=30+100
r3#0 COLL all_reduce g0:0 16B f32[4] sum step=0 t=0+10
r3#1 COMP step=0 t=10+120
r3#2 COLL all_reduce g0:1 16B f32[4] sum step=0 t=130+0
"""


def test_a_collective_with_the_sandbox_waits_for_every_vrank_and_releases_the_pruned_ones_too():
    g = parse_graph(COLL)
    sim = LiveSim(g, sandbox={1})
    first, second = op_key(g.nodes[1][0]), op_key(g.nodes[1][2])
    assert sim.issue_ns(0, first) == 0  # before any real event: at once
    sim.announce(0, first)
    assert sim.issue_ns(0, second) is None
    sim.report(0, first, 5_000)  # the hosted vrank's part completed for real
    # the pruned vranks 2 and 3 complete with it; 3 then computes 120, the others 20: the hosted
    # vrank's part of the next one is issued when the last vrank member arrives
    assert sim.issue_ns(0, second) == 5_000 + 120
