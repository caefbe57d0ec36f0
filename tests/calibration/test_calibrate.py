"""Slices, merging slice measurements onto a bare graph, and inter-slice calibration."""

import dataclasses

import pytest

from prism.calibration import (
    apply_measurements,
    calibrate,
    crowded_slices,
    median_of_takes,
    merge_slice,
    merge_takes,
    plan_slices,
    representatives,
    rotated_takes,
    settle_warmup,
    typical_steps,
    typical_takes,
)
from prism.core.errors import GraphError
from prism.graph.records import NodeKind, RankSummary
from prism.graph.text import parse_graph

pytestmark = pytest.mark.timeout(30)

# A 2-stage GPipe step as collect saw it: the structure is right, the times are not (the ranks
# were context-switched on shared slots).
BARE = """
graph world_size=2 kind=bare
group 0 ranks=0,1 desc=pp
r0#0 COMP d=7
r0#1 SEND g0:0 ->1 32KiB bf16[16,1024] d=999
r0#2 COMP d=7
r0#3 SEND g0:1 ->1 32KiB bf16[16,1024] d=999
r0#4 RECV g0:0 <-1 32KiB bf16[16,1024]
r0#5 COMP d=7
r0#6 RECV g0:1 <-1 32KiB bf16[16,1024]
r0#7 COMP d=7
r0#8 MARK step_end
r1#0 RECV g0:0 <-0 32KiB bf16[16,1024]
r1#1 COMP d=3
r1#2 COMP d=1
r1#3 SEND g0:0 ->0 32KiB bf16[16,1024] d=999
r1#4 RECV g0:1 <-0 32KiB bf16[16,1024]
r1#5 COMP d=5
r1#6 SEND g0:1 ->0 32KiB bf16[16,1024] d=999
r1#7 MARK step_end
"""

# What each rank recorded in its own slice (peers virtual, answering at once): forward 100 ns,
# backward 200 ns, 10 ns per message. Rank 1 ran forward and backward as one span per microbatch.
SLICE_0 = """
r0#0 COMP d=100
r0#1 SEND g0:0 ->1 32KiB bf16[16,1024] d=10
r0#2 COMP d=100
r0#3 SEND g0:1 ->1 32KiB bf16[16,1024] d=10
r0#4 RECV g0:0 <-1 32KiB bf16[16,1024] d=10
r0#5 COMP d=200
r0#6 RECV g0:1 <-1 32KiB bf16[16,1024] d=10
r0#7 COMP d=200
r0#8 MARK step_end
"""
SLICE_1 = """
r1#0 RECV g0:0 <-0 32KiB bf16[16,1024] d=10
r1#1 COMP d=300
r1#2 SEND g0:0 ->0 32KiB bf16[16,1024] d=10
r1#3 RECV g0:1 <-0 32KiB bf16[16,1024] d=10
r1#4 COMP d=300
r1#5 SEND g0:1 ->0 32KiB bf16[16,1024] d=10
r1#6 MARK step_end
"""


def measured(text, rank):
    return parse_graph(text).nodes[rank]


def test_slices_cover_each_template_once():
    assert plan_slices(range(10), 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    template_of = {r: r % 4 for r in range(16)}  # dp=4 replicas of a 4-rank model-parallel block
    assert representatives(16, template_of) == [0, 1, 2, 3]
    assert representatives(3) == [0, 1, 2]
    with pytest.raises(ValueError, match="slice size must be > 0"):
        plan_slices([0], 0)


def test_slices_whose_processes_outnumber_the_cpus_are_named_with_the_size_that_fits():
    msg = crowded_slices(2, 1, 2)  # the 2-core host's default: 2 real ranks and a replayer
    assert "3 processes on 2 CPU(s)" in msg and msg.endswith("slices of 1 fit this host (--slice-size)")
    assert crowded_slices(4, 1, 16) is None and crowded_slices(3, 1, 4) is None
    assert "fits" not in crowded_slices(1, 1, 1)  # no smaller slice fits one CPU


def test_merge_moves_slice_times_onto_the_bare_graph_by_segment():
    bare = parse_graph(BARE)
    merged = apply_measurements(bare, {0: measured(SLICE_0, 0), 1: measured(SLICE_1, 1)})
    r1 = merged.nodes[1]
    # Rank 1's bare segment of two compute nodes (3 and 1 ns) takes the measured 300 ns, split 3:1.
    assert [r1[1].duration_ns, r1[2].duration_ns] == [225, 75]
    assert r1[5].duration_ns == 300
    assert [n.duration_ns for n in merged.nodes[0] if n.kind.value == "SEND"] == [10, 10]


def test_calibration_propagates_the_waits_a_slice_cannot_see():
    bare = parse_graph(BARE)
    merged = apply_measurements(bare, {0: measured(SLICE_0, 0), 1: measured(SLICE_1, 1)})
    merged = dataclasses.replace(merged, summaries={
        0: RankSummary(rank=0, step_times_ns=(640,)),  # its own compute + messages in its slice
        1: RankSummary(rank=1, step_times_ns=(660,)),
    })
    timed, report = calibrate(merged, skip_steps=0)
    # By hand: r0 forwards until 200, sends land at 110 and 210; r1 forwards/backwards mb0 at
    # 110-410, sends back (420), mb1 at 420-720 (730); r0 backwards mb0 at 420-620, waits for
    # mb1's gradient until 730, backward ends at 930.
    assert report.ranks[0].calibrated_steps_ns == (930,)
    assert report.ranks[1].calibrated_steps_ns == (730,)
    assert report.iteration_ns == 930
    assert report.uncalibrated_iteration_ns == 660
    assert timed.kind == "timed"


def test_a_slice_that_took_another_path_is_rejected_by_name():
    bare = parse_graph(BARE)
    wrong = SLICE_1.replace("r1#2 SEND g0:0 ->0", "r1#2 RECV g0:0 <-0")
    with pytest.raises(GraphError, match="rank 1: slice node r1#2 RECV"):
        apply_measurements(bare, {0: measured(SLICE_0, 0), 1: measured(wrong, 1)})
    with pytest.raises(GraphError, match=r"ranks without a timing measurement: \[1\]"):
        apply_measurements(bare, {0: measured(SLICE_0, 0)})


def test_ranks_of_one_template_share_the_measurement():
    bare = parse_graph("""
group 0 ranks=0,1 desc=dp
r0#0 COMP d=1
r0#1 COLL all_reduce g0:0 16B f32[4] sum
r0#2 MARK step_end
r1#0 COMP d=2
r1#1 COLL all_reduce g0:0 16B f32[4] sum
r1#2 MARK step_end
""")
    slice_of_rank0 = parse_graph("""
r0#0 COMP d=50
r0#1 COLL all_reduce g0:0 16B f32[4] sum d=5
r0#2 MARK step_end
""").nodes[0]
    merged = apply_measurements(bare, {0: slice_of_rank0}, template_of={0: 0, 1: 0})
    assert [n.duration_ns for n in merged.nodes[1][:2]] == [50, 5]
    _, report = calibrate(merged, skip_steps=0)
    assert report.ranks[1].calibrated_steps_ns == (55,)


def test_warm_up_comm_ops_take_their_steady_state_duration():
    # The first all-reduce of a slice also connected the group's transport (0.46 s): left in, it
    # would put this stage behind the others at the start of the measured steps.
    g = parse_graph("""
graph world_size=2 kind=bare
group 0 ranks=0,1 desc=dp
r0#0 COLL barrier g0:0 step=0 d=3s
r0#1 COLL all_reduce g0:1 1KiB f32[256] sum step=0 d=460ms
r0#2 MARK step_end step=0
r0#3 COLL all_reduce g0:2 1KiB f32[256] sum step=1 d=3ms
r0#4 MARK step_end step=1
r0#5 COLL all_reduce g0:3 1KiB f32[256] sum step=2 d=5ms
r0#6 MARK step_end step=2
r0#7 COLL all_reduce g0:4 1KiB f32[256] sum step=3 d=4ms
r0#8 MARK step_end step=3
""")
    settled = settle_warmup(g, skip_steps=1)
    assert [n.duration_ns for n in settled.nodes[0] if n.is_comm] == [3_000_000_000, 4_000_000, 3_000_000, 5_000_000,
                                                                      4_000_000]
    assert settle_warmup(g, skip_steps=0) is g


def test_each_steady_step_takes_the_median_of_the_slices_measured_steps():
    # Step 2 of the slice ran during a burst of someone else's load.
    lines = ["graph world_size=2 kind=real", "group 0 ranks=0,1 desc=pp"]
    for step, (compute, send) in enumerate([(900, 50), (10, 2), (30, 9), (12, 3), (11, 2)]):
        lines += [f"r0#{3 * step} COMP step={step} d={compute}",
                  f"r0#{3 * step + 1} SEND g0:{step} ->1 16B f32[4] step={step} d={send}",
                  f"r0#{3 * step + 2} MARK step_end step={step}"]
    nodes = parse_graph("\n".join(lines)).nodes[0]
    typical = typical_steps(nodes, skip_steps=1)
    assert [n.duration_ns for n in typical if n.kind.value != "MARK"] == [900, 50, 11, 2, 11, 2, 11, 2, 11, 2]
    # a step that ran another program (here: no message) leaves the measurement as it was
    other = tuple(n for n in nodes if not (n.step == 3 and n.is_comm))
    assert typical_steps(other, skip_steps=1) == other


def test_a_slice_measured_three_times_gives_each_node_its_median_take():
    take = "graph world_size=1 kind=real\nr0#0 COMP step=1 d={}\nr0#1 COLL barrier g0:0 step=1 d={}\n"
    takes = [parse_graph(take.format(c, b)).nodes[0] for c, b in ((10, 7), (12, 5), (30, 6))]
    assert [n.duration_ns for n in median_of_takes(takes)] == [12, 6]


def _steps_graph(compute_by_rank: dict[int, list[int]]) -> str:
    """Each rank: per step a compute span, then a barrier of both ranks, then the step's end."""
    lines = ["graph world_size=2 kind=real", "group 0 ranks=0,1 desc=dp"]
    for rank, computes in compute_by_rank.items():
        for step, c in enumerate(computes):
            lines += [f"r{rank}#{3 * step} COMP step={step} d={c}",
                      f"r{rank}#{3 * step + 1} COLL barrier g0:{step} step={step} d=1",
                      f"r{rank}#{3 * step + 2} MARK step_end step={step}"]
    return "\n".join(lines)


def test_rotated_takes_keep_each_steps_spans_from_one_take():
    takes = [parse_graph(_steps_graph({0: [base + s for s in range(5)]})).nodes[0] for base in (100, 200, 300)]
    other = tuple(n for n in takes[0] if not (n.step == 3 and n.is_comm))  # another program: left out
    rotated = rotated_takes([*takes, other], skip_steps=1)
    computes = [n.duration_ns for n in rotated if n.kind is NodeKind.COMPUTE]
    # warm-up step 0 from take 0; measured step s from take (s - 1) mod 3
    assert computes == [100, 101, 202, 303, 104]
    assert merge_takes(takes, 1, "rotated") == rotated_takes(takes, 1)
    assert merge_takes(takes, 1, "median") == median_of_takes([typical_steps(t, 1) for t in takes])
    with pytest.raises(ValueError, match="unknown merge of calibration takes 'mean'"):
        merge_takes(takes, 1, "mean")


def test_with_the_takes_spans_step_by_step_a_collective_waits_for_that_steps_slow_member():
    # In the measured steps (1-4) each rank is slow every other step, never both at once: every
    # real step waits 20 ns for the slow one.
    ranks = {0: [20, 10, 20, 10, 20], 1: [20, 20, 10, 20, 10]}
    structure = parse_graph(_steps_graph(ranks))
    takes = {r: [structure.nodes[r]] for r in ranks}

    def calibrated(merge):
        merged = apply_measurements(structure, {r: merge_takes(t, 1, merge) for r, t in takes.items()})
        return calibrate(merged, skip_steps=1)[1].ranks[0].calibrated_steps_ns[1:]

    # Each rank's typical step (the median of 10, 20, 10, 20: 15) hides which member was slow in
    # each step; kept step by step, every barrier waits for the slow one, as in the real run.
    assert calibrated("median") == (16, 16, 16, 16)
    assert calibrated("rotated") == (21, 21, 21, 21)


def test_a_take_the_host_slowed_as_a_whole_is_left_out_of_the_rotation():
    # A slice of two ranks measured three times; in take 0 the host ran 10 % slow throughout (tp-sleep
    # on 16 cores, session 43: one take +8.8 %, the others +0.8 / +1.7 %).
    def take(scale):
        return parse_graph(_steps_graph({r: [int(100 * scale)] * 5 for r in (0, 1)})).nodes
    takes = {r: [take(1.10)[r], take(1.0)[r], take(1.02)[r]] for r in (0, 1)}
    assert typical_takes(takes, skip_steps=1) == [1, 2]
    merged = merge_slice(takes, 1, "rotated")
    for r in (0, 1):
        # measured step s from the kept takes in turn: 1, 2, 1, 2; the warm-up step from the first kept
        assert [n.duration_ns for n in merged[r] if n.kind is NodeKind.COMPUTE] == [100, 100, 102, 100, 102]
    # within 3 % of the median take every take is rotated in, and the median merge sees every take
    near = {r: [take(1.02)[r], take(1.0)[r], take(0.99)[r]] for r in (0, 1)}
    assert typical_takes(near, skip_steps=1) == [0, 1, 2]
    assert merge_slice(takes, 1, "median")[0] == merge_takes(takes[0], 1, "median")
    assert typical_takes({r: ts[:2] for r, ts in takes.items()}, skip_steps=1) == [0, 1]  # two takes: both
