"""What members of a comm op must agree on, and how it reads (prism.graph.opsig)."""

from prism.graph.opsig import describe, fingerprint, node_fields, op_key, recorded_ops
from prism.graph.records import CommOp, Graph, Node, NodeKind


def fields(op, shapes, **kw):
    return {"op": op, "group_id": "0", "seq": 3, "peer": -1, "reduce_op": "", "dtype": "f32", "shapes": shapes,
            "call_site": "train.py:9", **kw}


def test_an_all_reduce_of_another_shape_or_dtype_or_reduce_op_disagrees():
    base = fingerprint(fields(CommOp.ALL_REDUCE, ((4,),), reduce_op="sum"))
    assert fingerprint(fields(CommOp.ALL_REDUCE, ((4,),), reduce_op="sum", call_site="other.py:1")) == base
    assert fingerprint(fields(CommOp.ALL_REDUCE, ((5,),), reduce_op="sum")) != base
    assert fingerprint(fields(CommOp.ALL_REDUCE, ((4,),), reduce_op="max")) != base
    assert fingerprint(fields(CommOp.ALL_REDUCE, ((4,),), reduce_op="sum", dtype="bf16")) != base
    assert fingerprint(fields(CommOp.BROADCAST, ((4,),), peer=0)) != fingerprint(fields(CommOp.BROADCAST, ((4,),), peer=1))


def test_what_legitimately_differs_between_members_is_not_compared():
    # uneven all_gather inputs with the same gathered shapes; all_to_all splits; a message's shape
    assert fingerprint(fields(CommOp.ALL_GATHER, ((2,),), out_shapes=((2,), (3,)))) == \
        fingerprint(fields(CommOp.ALL_GATHER, ((3,),), out_shapes=((2,), (3,))))
    assert fingerprint(fields(CommOp.ALL_TO_ALL, ((6,),), in_splits=(1, 5))) == \
        fingerprint(fields(CommOp.ALL_TO_ALL, ((4,),), in_splits=(2, 2)))
    assert fingerprint(fields(CommOp.SEND, ((2, 2),), peer=1)) == fingerprint(fields(CommOp.RECV, ((4,),), peer=0))
    assert fingerprint(fields(CommOp.SEND, ((4,),), peer=1)) != fingerprint(fields(CommOp.RECV, ((5,),), peer=0))


def test_an_op_reads_like_collect_s_reports():
    before, after = describe(fields(CommOp.ALL_REDUCE, ((5,),), reduce_op="sum"))
    assert f"{before}3{after}" == "all_reduce sum on group 0 seq 3 f32 (5,) at train.py:9"
    before, after = describe(fields(CommOp.RECV, ((4,),), peer=1))
    assert f"{before}3{after}" == "recv from rank 1 on group 0 seq 3 f32 (4,) at train.py:9"


def test_both_ends_of_a_message_and_the_recorded_graph_name_it_alike():
    assert op_key(fields(CommOp.SEND, ((4,),), peer=2), 1) == op_key(fields(CommOp.RECV, ((4,),), peer=1), 2) \
        == ("0:1>2:", "p:1,2")
    send = Node(rank=1, index=0, kind=NodeKind.SEND, op=CommOp.SEND, group_id="0", seq=3, peer=2, dtype="f32",
                shapes=((4,),), call_site="train.py:9")
    graph = Graph(world_size=4, nodes={1: (send,)}, groups={}, summaries={}, kind="real", job_name="x", meta={})
    assert recorded_ops(graph, [1]) == {
        (1, "0:1>2:3"): (fingerprint(node_fields(send)), "send to rank 2 on group 0 seq 3 f32 (4,) at train.py:9")}
