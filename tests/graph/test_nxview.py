"""to_networkx(graph): records as (rank, index) nodes, instances as virtual nodes, edges in time order."""

from __future__ import annotations

import networkx as nx
import pytest

from prism.graph import Graph, instance_id, parse_graph, to_networkx

pytestmark = pytest.mark.timeout(60)


def edges(g: nx.DiGraph, kind: str) -> list:
    return sorted((u, v) for u, v, k in g.edges(data="kind") if k == kind)


def test_collective_instance_joins_the_members(two_rank_all_reduce: Graph) -> None:
    g = to_networkx(two_rank_all_reduce)
    inst0, inst1 = instance_id("0", 0), instance_id("0", 1)
    assert g.number_of_nodes() == 16 + 2
    assert g.nodes[(0, 1)]["label"] == "r0#1 COLL all_reduce g0:0 4KiB f32[1024] sum @train.py:52 step=0 t=100+220"
    assert g.nodes[(0, 1)]["kind"] == "COLLECTIVE" and g.nodes[(0, 1)]["op"] == "all_reduce"
    assert g.nodes[(1, 0)]["duration_ns"] == 300
    assert g.nodes[(1, 0)]["node"] is two_rank_all_reduce.nodes[1][0]
    assert g.nodes[inst0] == {"kind": "instance", "op": "all_reduce", "members": (0, 1)}
    assert edges(g, "issue") == sorted([((0, 1), inst0), ((1, 1), inst0), ((0, 5), inst1), ((1, 5), inst1)])
    # a synchronous collective releases each member's next node
    assert sorted(g.successors(inst0)) == [(0, 2), (1, 2)]
    assert len(edges(g, "program")) == 2 * 7
    assert nx.is_directed_acyclic_graph(g)


def test_longest_path_is_the_critical_path(two_rank_all_reduce: Graph) -> None:
    g = to_networkx(two_rank_all_reduce)
    # weigh each edge by the compute time of its source (comm durations include waiting)
    for u, v in g.edges:
        g.edges[u, v]["w"] = g.nodes[u]["duration_ns"] if g.nodes[u]["kind"] == "COMPUTE" else 0
    path = nx.dag_longest_path(g, weight="w")
    # the slow rank's compute sits on the critical path of both steps: 300 + 10 + 300 + 10
    assert (1, 0) in path and (1, 4) in path
    assert (0, 0) not in path and (0, 4) not in path
    assert nx.dag_longest_path_length(g, weight="w") == 620


def test_async_collective_completes_into_its_wait_and_send_feeds_recv() -> None:
    text = """
    group 0 ranks=0,1
    r0#0 COLL all_reduce g0:0 async
    r0#1 COMP d=5
    r0#2 WAIT #0
    r0#3 SEND g0:0 ->1 8B
    r1#0 COLL all_reduce g0:0 async
    r1#1 WAIT #0
    r1#2 RECV g0:0 <-0 8B
    """
    g = to_networkx(parse_graph(text))
    inst = instance_id("0", 0)
    assert edges(g, "wait") == [((0, 0), (0, 2)), ((1, 0), (1, 1))]
    assert sorted(g.successors(inst)) == [(0, 2), (1, 1)]  # the WAITs, not the next node
    assert edges(g, "p2p") == [((0, 3), (1, 2))]
    assert nx.is_directed_acyclic_graph(g)


def test_deadlocked_graph_shows_a_cycle() -> None:
    text = """
    group 0 ranks=0,1
    r0#0 RECV g0:0 <-1
    r0#1 SEND g0:0 ->1
    r1#0 RECV g0:0 <-0
    r1#1 SEND g0:0 ->0
    """
    g = to_networkx(parse_graph(text))
    assert sorted(nx.find_cycle(g)) == [((0, 0), (0, 1)), ((0, 1), (1, 0)), ((1, 0), (1, 1)), ((1, 1), (0, 0))]
