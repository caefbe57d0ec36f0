"""The one-line print form of a node parses back to the same node; small graphs are stated inline."""

from __future__ import annotations

import pytest

from prism.core.errors import GraphError
from prism.graph import (
    CommOp,
    Graph,
    GroupInfo,
    Node,
    NodeKind,
    RankSummary,
    format_graph,
    format_node,
    parse_graph,
    parse_node,
)

pytestmark = pytest.mark.timeout(60)

EXAMPLES = [
    # (node, its exact print form)
    (
        Node(3, 41, NodeKind.COLLECTIVE, CommOp.ALL_REDUCE, group_id="7", seq=12, size_bytes=4 << 20,
             dtype="f32", shapes=((1024, 1024),), reduce_op="sum", is_async=True, call_site="train.py:52",
             start_ns=1200, duration_ns=350),
        "r3#41 COLL all_reduce g7:12 4MiB f32[1024,1024] sum async @train.py:52 t=1200+350",
    ),
    (Node(0, 0, NodeKind.COMPUTE, duration_ns=1000), "r0#0 COMP d=1000"),
    (Node(0, 1, NodeKind.COMPUTE, start_ns=5, duration_ns=0, step=2), "r0#1 COMP step=2 t=5+0"),
    (Node(0, 2, NodeKind.COMPUTE, start_ns=7), "r0#2 COMP t=7"),
    (
        Node(0, 5, NodeKind.SEND, CommOp.SEND, group_id="0", seq=3, peer=1, tag=2, size_bytes=65536,
             dtype="bf16", shapes=((32, 1024),), start_ns=900, duration_ns=40),
        "r0#5 SEND g0:3 ->1 tag=2 64KiB bf16[32,1024] t=900+40",
    ),
    (
        Node(1, 2, NodeKind.RECV, CommOp.RECV, group_id="0", seq=3, peer=0, size_bytes=65536, dtype="bf16",
             shapes=((32, 1024),), is_async=True),
        "r1#2 RECV g0:3 <-0 64KiB bf16[32,1024] async",
    ),
    (Node(1, 3, NodeKind.SEND, None, group_id="0", seq=0, peer=0), "r1#3 SEND op=none g0:0 ->0"),
    (
        Node(2, 9, NodeKind.COLLECTIVE, CommOp.ALL_TO_ALL, group_id="ep", seq=0, size_bytes=1000, dtype="f32",
             shapes=((16, 16),), out_shapes=((20, 16),), in_splits=(4, 4, 4, 4), out_splits=(5, 5, 5, 5)),
        "r2#9 COLL all_to_all gep:0 1000B f32[16,16] out[20,16] in_splits=4,4,4,4 out_splits=5,5,5,5",
    ),
    (
        Node(2, 4, NodeKind.COLLECTIVE, CommOp.ALL_GATHER, group_id="1", seq=5, dtype="f32",
             shapes=((4,),), out_shapes=((4,), (4,))),
        "r2#4 COLL all_gather g1:5 f32[4] out[4][4]",
    ),
    (
        Node(1, 0, NodeKind.COLLECTIVE, CommOp.BROADCAST, group_id="0", seq=0, peer=0, dtype="i64", shapes=((),)),
        "r1#0 COLL broadcast g0:0 root=0 i64[]",
    ),
    (Node(1, 1, NodeKind.COLLECTIVE, CommOp.BARRIER, group_id="0", seq=1), "r1#1 COLL barrier g0:1"),
    (Node(1, 2, NodeKind.COLLECTIVE, CommOp.GATHER, group_id="0"), "r1#2 COLL gather g0:"),
    (Node(0, 7, NodeKind.WAIT, target=4, duration_ns=30), "r0#7 WAIT #4 d=30"),
    (Node(0, 8, NodeKind.MARK, mark="step_end", step=0, start_ns=5000, duration_ns=0),
     "r0#8 MARK step_end step=0 t=5000+0"),
    (Node(0, 9, NodeKind.MARK, mark="phase two"), "r0#9 MARK mark=phase%20two"),
    (
        Node(4, 1, NodeKind.COLLECTIVE, CommOp.REDUCE_SCATTER, group_id="mesh=tp 1", seq=2, dtype="f8e4m3",
             reduce_op="custom_op", call_site="my dir/t.py:9", payload="ab12"),
        "r4#1 COLL reduce_scatter gmesh%3Dtp%201:2 f8e4m3 reduce=custom_op @my%20dir/t.py:9 payload=ab12",
    ),
]


@pytest.mark.parametrize(("node", "text"), EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_node_prints_as_one_line_and_parses_back(node: Node, text: str) -> None:
    assert format_node(node) == text
    assert parse_node(text) == node


def test_every_kind_and_op_round_trips() -> None:
    kinds = {node.kind for node, _ in EXAMPLES}
    assert kinds == set(NodeKind)
    for op in CommOp:
        node = Node(0, 0, NodeKind.COLLECTIVE, op, group_id="0", seq=1, size_bytes=3 << 30, is_async=True)
        assert parse_node(format_node(node)) == node


def test_sizes_print_in_the_largest_exact_unit() -> None:
    def size(n: int) -> str:
        return format_node(Node(0, 0, NodeKind.COLLECTIVE, CommOp.ALL_REDUCE, size_bytes=n)).split()[-1]

    assert [size(n) for n in (1, 1024, 1536, 3 << 20, 2 << 30)] == ["1B", "1KiB", "1536B", "3MiB", "2GiB"]


def test_parser_accepts_time_units_for_hand_written_graphs() -> None:
    assert parse_node("r0#0 COMP d=5us").duration_ns == 5_000
    assert parse_node("r0#0 COMP t=2ms+1s") == Node(0, 0, NodeKind.COMPUTE, start_ns=2_000_000,
                                                  duration_ns=1_000_000_000)


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("r0#0 FOO", "unknown kind 'FOO'"),
        ("x0#0 COMP", "bad head 'x0#0'"),
        ("r0 COMP", "head 'r0' has no #index"),
        ("r0#0 COMP bogus=1", "unknown token 'bogus=1'"),
        ("r0#0 COMP d=5h", "bad time '5h'"),
    ],
)
def test_bad_lines_name_the_problem(line: str, complaint: str) -> None:
    with pytest.raises(GraphError, match=f"cannot parse node line '{line}': {complaint}"):
        parse_node(line)


def test_a_bare_kind_is_a_node_with_every_field_at_its_default() -> None:
    assert parse_node("r0#0 COMP") == Node(0, 0, NodeKind.COMPUTE)


INLINE = """
# a comment line
graph world_size=3 kind=timed job_name=tiny
meta seed=7
meta note=two%20words
group 0 ranks=0,1,2 desc=default_pg
group 1 ranks=0,2
r0 COMP d=10
r0 COLL all_reduce g0:0 16B f32[4] sum async
r0 WAIT #1
r1 COLL all_reduce g0:0 16B f32[4] sum
r2#0 COLL all_reduce g0:0 16B f32[4] sum
r2#1 RECV g1:0 <-0 8B
summary r2 step_times_ns=100,110 losses=1.5,0.1 exit_code=3
"""


def test_inline_graph_states_groups_nodes_and_summaries() -> None:
    g = parse_graph(INLINE)
    assert g.world_size == 3 and g.kind == "timed" and g.job_name == "tiny"
    assert g.meta == {"seed": "7", "note": "two words"}
    assert g.groups == {"0": GroupInfo("0", (0, 1, 2), "default_pg"), "1": GroupInfo("1", (0, 2))}
    assert [len(g.nodes[r]) for r in range(3)] == [3, 1, 2]
    # `r0 ...` without #index takes the next index
    assert g.nodes[0][2] == Node(0, 2, NodeKind.WAIT, target=1)
    assert g.nodes[2][1] == Node(2, 1, NodeKind.RECV, CommOp.RECV, group_id="1", seq=0, peer=0, size_bytes=8)
    assert g.summaries == {2: RankSummary(2, losses=(1.5, 0.1), step_times_ns=(100, 110), exit_code=3)}


def test_graph_text_round_trips(two_rank_all_reduce: Graph, pipeline_2stage: Graph) -> None:
    for g in (parse_graph(INLINE), two_rank_all_reduce, pipeline_2stage):
        assert parse_graph(format_graph(g)) == g


def test_world_size_defaults_to_highest_rank_named() -> None:
    g = parse_graph("r0#0 COMP\nr3#0 COMP\n")
    assert g.world_size == 4
    assert g.nodes[1] == () and g.nodes[2] == ()


def test_graph_text_rejects_out_of_order_indices() -> None:
    with pytest.raises(GraphError, match=r"line 2: .*index 2 out of order \(expected #1\)"):
        parse_graph("r0#0 COMP\nr0#2 COMP\n")


def test_graph_text_rejects_ranks_beyond_world_size() -> None:
    with pytest.raises(GraphError, match="names rank 2 but world_size is 2"):
        parse_graph("graph world_size=2\nr2#0 COMP\n")
