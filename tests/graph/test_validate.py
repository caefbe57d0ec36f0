"""validate(graph) lists every inconsistency, each naming the rank, node and op."""

from __future__ import annotations

import pytest

from prism.core.errors import GraphError
from prism.graph import Graph, Violation, check, parse_graph, validate

pytestmark = pytest.mark.timeout(60)


def messages(text: str) -> list[str]:
    return [str(v) for v in validate(parse_graph(text))]


def test_golden_graphs_are_valid(two_rank_all_reduce: Graph, pipeline_2stage: Graph) -> None:
    assert validate(two_rank_all_reduce) == []
    assert validate(pipeline_2stage) == []
    check(two_rank_all_reduce)


def test_missing_member_names_the_rank_and_the_op() -> None:
    text = """
    group 0 ranks=0,1,2
    r0#0 COLL all_reduce g0:0 16B f32[4] sum
    r1#0 COLL all_reduce g0:0 16B f32[4] sum
    r2#0 COMP d=5
    """
    assert validate(parse_graph(text)) == [
        Violation(
            rank=2,
            index=-1,
            node="r0#0 COLL all_reduce g0:0 16B f32[4] sum",
            message="never issues collective g0:0 all_reduce that ranks [0, 1] issue",
        )
    ]


def test_mismatched_shapes_name_the_odd_rank() -> None:
    text = """
    group 0 ranks=0,1
    r0#0 COLL all_reduce g0:0 16B f32[4] sum
    r1#0 COLL all_reduce g0:0 32B f32[8] sum
    """
    assert messages(text) == [
        "r1#0: shapes ((8,),) differs from r0#0's ((4,),) in g0:0 [r1#0 COLL all_reduce g0:0 32B f32[8] sum]",
        "r1#0: size_bytes 32 differs from r0#0's 16 in g0:0 [r1#0 COLL all_reduce g0:0 32B f32[8] sum]",
    ]


def test_mismatched_op_dtype_and_reduce_op() -> None:
    assert messages(
        "group 0 ranks=0,1\nr0#0 COLL all_reduce g0:0 f32[4] sum\nr1#0 COLL broadcast g0:0 root=0 f32[4]\n"
    ) == ["r1#0: op 'broadcast' differs from r0#0's 'all_reduce' in g0:0 [r1#0 COLL broadcast g0:0 root=0 f32[4]]"]
    assert messages("group 0 ranks=0,1\nr0#0 COLL all_reduce g0:0 f32[4] sum\nr1#0 COLL all_reduce g0:0 bf16[4] max\n") == [
        "r1#0: dtype 'bf16' differs from r0#0's 'f32' in g0:0 [r1#0 COLL all_reduce g0:0 bf16[4] max]",
        "r1#0: reduce op 'max' differs from r0#0's 'sum' in g0:0 [r1#0 COLL all_reduce g0:0 bf16[4] max]",
    ]


def test_send_without_recv_and_bytes_mismatch() -> None:
    text = """
    group 0 ranks=0,1
    r0#0 SEND g0:0 ->1 64B
    r0#1 SEND g0:1 ->1 64B
    r1#0 RECV g0:0 <-0 32B
    """
    assert messages(text) == [
        "r1#0: message r0->r1 g0:0: receives 32 bytes but r0#0 sends 64 [r1#0 RECV g0:0 <-0 32B]",
        "r0#1: message r0->r1 g0:1 is never received by rank 1 [r0#1 SEND g0:1 ->1 64B]",
    ]


def test_recv_without_send() -> None:
    assert messages("group 0 ranks=0,1\nr1#0 RECV g0:0 <-0 8B\n") == [
        "r1#0: message r0->r1 g0:0 is never sent by rank 0 [r1#0 RECV g0:0 <-0 8B]"
    ]


UNEVEN_ALL_TO_ALL = """
group ep ranks=0,1,2
r0#0 COLL all_to_all gep:0 f32[6,8] out[9,8] in_splits=1,2,3 out_splits=1,4,4
r1#0 COLL all_to_all gep:0 f32[10,8] out[6,8] in_splits=4,2,4 out_splits=2,2,2
r2#0 COLL all_to_all gep:0 f32[9,8] out[10,8] in_splits=4,2,3 out_splits={r2_splits}
"""


def test_uneven_all_to_all_with_consistent_splits_is_valid() -> None:
    # what i sends to j (i's in_splits[j]) is what j expects from i (j's out_splits[i])
    assert messages(UNEVEN_ALL_TO_ALL.format(r2_splits="3,4,3")) == []


def test_uneven_all_to_all_split_mismatch_names_sender_and_receiver() -> None:
    # rank 2 expects 3 rows from rank 1 (which sends 4) and 4 from itself (it sends 3)
    assert messages(UNEVEN_ALL_TO_ALL.format(r2_splits="3,3,4")) == [
        "r1#0: all_to_all sends 4 rows to rank 2, which expects 3 from rank 1 in gep:0 "
        "[r1#0 COLL all_to_all gep:0 f32[10,8] out[6,8] in_splits=4,2,4 out_splits=2,2,2]",
        "r2#0: all_to_all sends 3 rows to rank 2, which expects 4 from rank 2 in gep:0 "
        "[r2#0 COLL all_to_all gep:0 f32[9,8] out[10,8] in_splits=4,2,3 out_splits=3,3,4]",
    ]


def test_all_to_all_splits_must_cover_the_group() -> None:
    text = "group 0 ranks=0,1\nr0#0 COLL all_to_all g0:0 f32[4,2] in_splits=4\nr1#0 COLL all_to_all g0:0 f32[4,2]\n"
    assert messages(text) == [
        "r0#0: all_to_all in_splits has 1 entries for a group of 2 in g0:0 "
        "[r0#0 COLL all_to_all g0:0 f32[4,2] in_splits=4]"
    ]


def test_even_all_to_all_derives_splits_from_shapes() -> None:
    ok = "group 0 ranks=0,1\nr0#0 COLL all_to_all g0:0 f32[4,2]\nr1#0 COLL all_to_all g0:0 f32[4,2]\n"
    assert messages(ok) == []
    bad = "group 0 ranks=0,1\nr0#0 COLL all_to_all g0:0 f32[4,2]\nr1#0 COLL all_to_all g0:0 f32[6,2]\n"
    assert messages(bad) == [
        "r0#0: all_to_all sends 2 rows to rank 1, which expects 3 from rank 0 in g0:0 "
        "[r0#0 COLL all_to_all g0:0 f32[4,2]]",
        "r1#0: all_to_all sends 3 rows to rank 0, which expects 2 from rank 1 in g0:0 "
        "[r1#0 COLL all_to_all g0:0 f32[6,2]]",
    ]


def test_all_gather_list_outputs_must_hold_each_input() -> None:
    text = """
    group 0 ranks=0,1
    r0#0 COLL all_gather g0:0 f32[4] out[4][2]
    r1#0 COLL all_gather g0:0 f32[2] out[4][2]
    """
    assert messages(text) == []  # uneven all_gather: entry j is member j's input
    assert messages(text.replace("f32[2] out", "f32[3] out")) == [
        "r0#0: all_gather output 1 [2] but rank 1 contributes [3] in g0:0 [r0#0 COLL all_gather g0:0 f32[4] out[4][2]]",
        "r1#0: all_gather output 1 [2] but rank 1 contributes [3] in g0:0 [r1#0 COLL all_gather g0:0 f32[3] out[4][2]]",
    ]


def test_wait_must_target_an_earlier_comm_node_of_its_rank() -> None:
    text = """
    group 0 ranks=0
    r0#0 COMP d=5
    r0#1 WAIT #0
    r0#2 WAIT #7
    r0#3 COLL barrier g0:0 async
    r0#4 WAIT #3
    """
    assert messages(text) == [
        "r0#1: WAIT target #0 is a COMPUTE, not a comm node [r0#1 WAIT #0]",
        "r0#2: WAIT target #7 is not an earlier node of rank 0 [r0#2 WAIT #7]",
    ]


def test_structural_problems() -> None:
    text = """
    group 0 ranks=0,1
    group 1 ranks=1
    r0#0 COLL barrier g9:0
    r0#1 COLL barrier g1:0
    r0#2 SEND g0:0 ->0 8B
    r0#3 COLL barrier g0:1
    r0#4 COLL barrier g0:0
    r1#0 COLL barrier g0:1
    r1#1 COLL barrier g0:0
    """
    assert messages(text) == [
        "r0#0: unknown group '9' [r0#0 COLL barrier g9:0]",
        "r0#1: rank 0 is not a member of group '1' [1] [r0#1 COLL barrier g1:0]",
        "r0#2: peer 0 is not another member of group '0' [r0#2 SEND g0:0 ->0 8B]",
        "r0#4: seq 0 issued after seq 1 on group '0' [r0#4 COLL barrier g0:0]",
        "r1#1: seq 0 issued after seq 1 on group '0' [r1#1 COLL barrier g0:0]",
    ]


def test_duplicate_issue_of_one_instance() -> None:
    text = "group 0 ranks=0,1\nr0#0 COLL barrier g0:0\nr0#1 COLL barrier g0:0\nr1#0 COLL barrier g0:0\n"
    assert messages(text) == [
        "r0#1: seq 0 issued after seq 0 on group '0' [r0#1 COLL barrier g0:0]",
        "r0#1: issues collective g0:0 twice (also #0) [r0#1 COLL barrier g0:0]",
    ]


def test_check_raises_with_every_violation() -> None:
    g = parse_graph("group 0 ranks=0,1\nr0#0 SEND g0:0 ->1 8B\nr0#1 SEND g0:1 ->1 8B\n")
    with pytest.raises(GraphError) as info:
        check(g)
    assert str(info.value) == (
        "graph has 2 violation(s):\n"
        "  r0#0: message r0->r1 g0:0 is never received by rank 1 [r0#0 SEND g0:0 ->1 8B]\n"
        "  r0#1: message r0->r1 g0:1 is never received by rank 1 [r0#1 SEND g0:1 ->1 8B]"
    )
