"""Iteration boundaries from the period of a rank's comm sequence (prism.graph.steps)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prism.graph import parse_node
from prism.graph.records import NodeKind
from prism.graph.steps import (
    EXHAUSTIVE_UP_TO,
    MIN_COVERAGE,
    Period,
    find_period,
    infer_step_marks,
    no_steps_message,
    step_times_from_marks,
)


def _brute_force(seq: list[int]) -> Period | None:
    """Every (start, period): the most whole repetitions; ties: smallest period, then earliest."""
    n = len(seq)
    best = None
    for p in range(1, n // 2 + 1):
        for s in range(n - 2 * p + 1):
            count = 1
            while s + (count + 1) * p <= n and seq[s + count * p: s + (count + 1) * p] == seq[s: s + p]:
                count += 1
            if count >= 2:
                got = Period(s, p, count)
                if best is None or (-got.coverage, p, s) < (-best.coverage, best.length, best.start):
                    best = got
    if best is None or best.coverage < MIN_COVERAGE * n:
        return None
    return best


def _root(block: list[int]) -> int:
    """Length of the shortest block whose repetitions make ``block``."""
    n = len(block)
    return next(d for d in range(1, n + 1) if n % d == 0 and block == block[:d] * (n // d))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40))
def test_short_sequences_match_the_exhaustive_definition(seq):
    assert find_period(seq) == _brute_force(seq)


@settings(max_examples=200, deadline=None)
@given(block=st.lists(st.integers(0, 5), min_size=1, max_size=12), count=st.integers(2, 8),
       prologue=st.lists(st.integers(0, 5), max_size=6), epilogue=st.lists(st.integers(0, 5), max_size=6))
def test_structured_sequences_match_the_exhaustive_definition(block, count, prologue, epilogue):
    seq = prologue + block * count + epilogue
    assert find_period(seq) == _brute_force(seq)


@settings(max_examples=60, deadline=None)
@given(block=st.lists(st.integers(0, 9), min_size=30, max_size=80), count=st.integers(36, 50),
       prologue=st.lists(st.integers(100, 105), max_size=40), epilogue=st.lists(st.integers(200, 205), max_size=40))
def test_long_sequences_find_the_planted_steps(block, count, prologue, epilogue):
    """Past EXHAUSTIVE_UP_TO the candidates come from prefix functions only; a prologue (warmup,
    shape exchange) and an epilogue (a final barrier) made of other ops stay outside the run."""
    seq = prologue + block * count + epilogue
    assert len(seq) > EXHAUSTIVE_UP_TO
    root = _root(block)
    assert find_period(seq) == Period(len(prologue), root, count * len(block) // root)


@settings(max_examples=60, deadline=None)
@given(block=st.lists(st.integers(0, 9), min_size=30, max_size=80), count=st.integers(36, 50),
       prologue=st.lists(st.integers(0, 9), max_size=60), epilogue=st.lists(st.integers(0, 9), max_size=60))
def test_long_sequences_with_lookalike_ops_keep_the_period(block, count, prologue, epilogue):
    """A prologue made of ops that also occur in a step may extend the run by whole repetitions,
    never change its period."""
    seq = prologue + block * count + epilogue
    got = find_period(seq)
    assert got is not None and got.length == _root(block) and got.coverage >= count * len(block)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 3000))
def test_a_sequence_that_never_repeats_has_no_period(n):
    assert find_period(list(range(n))) is None


def test_a_repeat_that_covers_less_than_half_is_not_a_step():
    assert find_period([1, 2, 1, 2] + list(range(10, 20))) is None
    assert find_period([1, 2, 1, 2, 1, 2] + list(range(10, 16))) == Period(0, 2, 3)


def _rank0_pipeline(steps: int) -> list:
    """Rank 0 of a 2-stage pipeline: a shape exchange at step 0, then per step two forward sends
    (isend + wait) and two backward recvs, then a final barrier."""
    lines = ["r0#0 COMP d=100 t=0+100", "r0#1 SEND g0:0 ->1 8B i64[1] t=100+5", "r0#2 COMP d=5 t=105+5"]
    t, send_seq, recv_seq = 110, 1, 0
    for _ in range(steps):
        for _mb in range(2):
            lines.append(f"r0#{len(lines)} COMP d=50 t={t}+50")
            t += 50
            lines.append(f"r0#{len(lines)} SEND g0:{send_seq} ->1 1KiB f32[16,16] async t={t}+1")
            lines.append(f"r0#{len(lines)} WAIT #{len(lines) - 1} t={t + 1}+1")
            send_seq += 1
            t += 2
        for _mb in range(2):
            lines.append(f"r0#{len(lines)} RECV g0:{recv_seq} <-1 1KiB f32[16,16] t={t}+20")
            recv_seq += 1
            t += 20
    lines.append(f"r0#{len(lines)} COLL barrier g0:0 t={t}+3")
    return [parse_node(line) for line in lines]


def test_marks_go_before_the_first_op_of_each_later_step_and_waits_follow_their_targets():
    nodes = _rank0_pipeline(steps=4)
    got = infer_step_marks(nodes)
    assert got.period == Period(1, 6, 4)  # send, wait, send, wait, recv, recv; the shape exchange is a prologue
    marks = [n for n in got.nodes if n.kind is NodeKind.MARK]
    assert len(marks) == 4
    assert [m.step for m in marks] == [0, 1, 2, 3]
    for i, n in enumerate(got.nodes):
        assert n.index == i
        if n.kind is NodeKind.WAIT:
            assert got.nodes[n.target].kind is NodeKind.SEND and n.target == i - 1
        if n.kind is NodeKind.MARK:
            assert got.nodes[i + 1].kind is NodeKind.COMPUTE or got.nodes[i + 1].is_comm
            assert got.nodes[i + 1].start_ns == n.start_ns
    # step 0: rank start (0) to its mark; every later step one period, 144 ns (2*(50+2) + 2*20)
    assert step_times_from_marks(got.nodes, 0) == (254, 144, 144, 144)
    assert got.nodes[-1].step == 4 and got.nodes[-1].op.value == "barrier"


def test_the_last_repetition_is_a_whole_step_without_an_epilogue():
    nodes = _rank0_pipeline(steps=3)[:-1]
    got = infer_step_marks(nodes)
    assert got.num_steps == 3 and got.nodes[-1].kind is NodeKind.MARK
    assert step_times_from_marks(got.nodes, 0) == (254, 144, 144)


def test_a_rank_without_a_repeating_sequence_keeps_its_nodes():
    nodes = [parse_node("r0#0 COMP d=10"), parse_node("r0#1 COLL barrier g0:0"),
             parse_node("r0#2 COLL all_reduce g0:1 16B f32[4] sum")]
    got = infer_step_marks(nodes)
    assert got.period is None and got.nodes == tuple(nodes) and got.num_steps == 0


def test_the_message_names_the_ranks_and_both_fixes():
    line = no_steps_message([1, 3])
    assert "ranks 1, 3" in line and "iterations.boundary" in line and "prism.mark_step()" in line
    assert "\n" not in line and "nan" not in line.lower()


def test_waits_tell_a_step_from_its_microbatches():
    """The last stage of a pipeline: per microbatch a recv (waited) and an async send, alike; the
    sends are waited once per step. Without the waits the period would be one microbatch."""
    lines, t = [], 0
    for step in range(5):
        sends = []
        for mb in range(4):
            lines.append(f"r3#{len(lines)} RECV g0:{4 * step + mb} <-2 1KiB f32[16,16] t={t}+5")
            lines.append(f"r3#{len(lines)} WAIT #{len(lines) - 1} t={t + 5}+0")
            lines.append(f"r3#{len(lines)} COMP d=12 t={t + 5}+12")
            lines.append(f"r3#{len(lines)} SEND g0:{4 * step + mb} ->2 1KiB f32[16,16] async t={t + 17}+1")
            sends.append(len(lines) - 1)
            t += 18
        for s in sends:
            lines.append(f"r3#{len(lines)} WAIT #{s} t={t}+1")
            t += 1
    got = infer_step_marks([parse_node(line) for line in lines])
    assert got.period == Period(0, 16, 5) and got.num_steps == 5
    assert step_times_from_marks(got.nodes, 0) == (76,) * 5

