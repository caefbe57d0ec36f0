"""Chakra ET export: one length-delimited protobuf file per rank, read back message for message,
with the program's dependencies as edges."""

import pytest

from prism.graph._pb import et_def_pb2 as et
from prism.graph.chakra import CHAKRA_VERSION, chakra_nodes, read_chakra, write_chakra
from prism.graph.records import NodeKind
from prism.graph.text import parse_graph
from prism.core.errors import RunDirError

pytestmark = pytest.mark.timeout(30)

GRAPH = parse_graph("""
graph world_size=2 kind=real job_name=chakra
group 0 ranks=0,1 desc=dp
group 1 ranks=0,1 desc=pp
r0#0 COMP step=0 t=0+100000
r0#1 COLL all_reduce g0:0 4MiB f32[1048576] sum async step=0 t=100000+50000
r0#2 SEND g1:0 ->1 tag=3 64KiB bf16[32,1024] step=0 t=101000+2000
r0#3 COMP step=0 t=103000+30000
r0#4 WAIT #1 step=0 t=133000+17000
r0#5 COMP step=0 t=150000+1000
r0#6 MARK step_end step=0 t=151000+0
r1#0 RECV g1:0 <-0 tag=3 64KiB bf16[32,1024] step=0 t=0+103000
r1#1 COMP step=0 t=103000+10000
r1#2 COLL all_reduce g0:0 4MiB f32[1048576] sum async step=0 t=113000+37000
r1#3 MARK step_end step=0 t=151000+0
""")


def attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def test_round_trip_of_every_rank_file(tmp_path):
    paths = write_chakra(GRAPH, tmp_path, "job")
    assert [p.name for p in paths] == ["job.0.et", "job.1.et"]
    for rank, path in enumerate(paths):
        meta, nodes = read_chakra(path)
        assert meta.version == CHAKRA_VERSION
        assert {a.name: getattr(a, a.WhichOneof("value")) for a in meta.attr}["rank"] == rank
        assert nodes == list(chakra_nodes(GRAPH.nodes[rank]))
        written = [n for n in GRAPH.nodes[rank] if n.kind not in (NodeKind.WAIT, NodeKind.MARK)]
        assert [n.id for n in nodes] == [n.index for n in written]
        for got, want in zip(nodes, written, strict=True):
            a = attrs(got)
            assert a["prism_duration_ns"] == want.duration_ns and a["prism_step"] == want.step
            assert got.duration_micros == round(want.duration_ns / 1000)
            assert got.start_time_micros == round(want.start_ns / 1000)
            if want.is_comm:
                assert (a["pg_name"], a["prism_seq"], a["comm_size"], a["prism_async"]) == (
                    want.group_id, want.seq, want.size_bytes, want.is_async)


def test_node_types_comm_attributes_and_program_dependencies():
    nodes = {n.id: n for n in chakra_nodes(GRAPH.nodes[0])}
    assert [et.NodeType.Name(n.type) for n in nodes.values()] == [
        "COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMP_NODE", "COMP_NODE"]
    assert attrs(nodes[1])["comm_type"] == et.ALL_REDUCE
    assert {k: attrs(nodes[2])[k] for k in ("comm_src", "comm_dst", "comm_tag")} == {"comm_src": 0, "comm_dst": 1, "comm_tag": 3}
    # the async all-reduce blocks nothing until its WAIT; the sync send blocks the next compute
    assert list(nodes[2].data_deps) == [0]
    assert list(nodes[3].data_deps) == [2]
    assert list(nodes[5].data_deps) == [3, 1]
    recv_side = {n.id: n for n in chakra_nodes(GRAPH.nodes[1])}
    assert list(recv_side[1].data_deps) == [0]


def test_a_truncated_file_is_named(tmp_path):
    (path, _) = write_chakra(GRAPH, tmp_path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(RunDirError, match=r"prism\.0\.et: truncated"):
        read_chakra(path)
