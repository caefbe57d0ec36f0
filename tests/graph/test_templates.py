"""DP templates: replica permutations from the mesh, expansion of a templated graph, its on-disk form."""

import dataclasses

import pytest

from prism.core.errors import RunDirError
from prism.graph import (
    GroupInfo,
    build_template_map,
    dp_permutations,
    expand,
    parse_graph,
    read_graph,
    validate,
    write_graph,
)
from prism.graph.io import MANIFEST_NAME
from prism.graph.records import RankSummary

pytestmark = pytest.mark.timeout(30)

MESH = ("pp", "dp", "cp", "tp")


def test_replicas_shift_the_dp_coordinate_of_the_hybrid_mesh():
    # init_device_mesh((pp=2, dp=2, tp=2)): rank = pp*4 + dp*2 + tp; replica 0 = dp 0 = 0,1,4,5.
    perms = dp_permutations({"pp": 2, "dp": 2, "cp": 1, "tp": 2}, MESH)
    assert perms[0] == tuple(range(8))
    assert perms[1] == (2, 3, 0, 1, 6, 7, 4, 5)
    # pp=2, dp=8, tp=4 (W=64): rank 37 = (pp 1, dp 1, tp 1) plays template 33's role in replica 1.
    perms = dp_permutations({"pp": 2, "dp": 8, "cp": 1, "tp": 4}, MESH)
    assert len(perms) == 8 and perms[1][33] == 37 and perms[7][33] == 33 + 7 * 4
    assert all(sorted(p) == list(range(64)) for p in perms)


def test_another_mesh_order_puts_dp_innermost():
    perms = dp_permutations({"pp": 1, "dp": 2, "cp": 1, "tp": 2}, ("tp", "pp", "cp", "dp"))
    assert perms[1] == (1, 0, 3, 2)


# W=4, dp=2 x tp=2, mesh (dp, tp): templates 0, 1; replica 1 = 2, 3.
TEMPLATED = """
graph world_size=4 kind=bare job_name=t
group 0 ranks=0,1,2,3 desc=default_pg
group 1 ranks=0,1 desc=mesh_tp
group 2 ranks=2,3 desc=mesh_tp
group 3 ranks=0,2 desc=mesh_dp
group 4 ranks=1,3 desc=mesh_dp
r0#0 COLL broadcast g0:0 8B i64[1] root=0 payload=abc
r0#1 COLL all_reduce g1:0 16B f32[4] sum
r0#2 SEND g1:0 ->1 16B f32[4]
r0#3 COLL reduce_scatter g3:0 16B f32[4] out[2] avg
r0#4 COLL broadcast g3:1 16B f32[4] root=0
r0#5 MARK step_end
r1#0 COLL broadcast g0:0 8B i64[1] root=0
r1#1 COLL all_reduce g1:0 16B f32[4] sum
r1#2 RECV g1:0 <-0 16B f32[4]
r1#3 COLL reduce_scatter g4:0 16B f32[4] out[2] avg
r1#4 COLL broadcast g4:1 16B f32[4] root=1
r1#5 MARK step_end
"""


def _templated():
    g = parse_graph(TEMPLATED)
    perms = dp_permutations({"pp": 1, "dp": 2, "cp": 1, "tp": 2}, MESH)
    known = list(g.groups.values())
    used = [g.groups[i] for i in ("0", "1", "3", "4")]
    tmap, groups = build_template_map(perms, used, known)
    summaries = {r: RankSummary(rank=r, losses=(1.5,), step_times_ns=(100,), peak_memory_bytes=64) for r in (0, 1)}
    nodes = {r: g.nodes[r] for r in (0, 1)}
    return dataclasses.replace(g, nodes=nodes, groups={**g.groups, **groups}, templates=tmap, summaries=summaries)


def test_expansion_renames_ranks_groups_peers_and_keeps_roots_of_groups_that_span_replicas():
    full = expand(_templated())
    assert sorted(full.nodes) == [0, 1, 2, 3] and full.templates is None
    r2, r3 = full.nodes[2], full.nodes[3]
    assert (r2[1].group_id, r3[1].group_id) == ("2", "2")      # tp group of replica 1
    assert (r3[2].peer, r3[2].group_id) == (2, "2")            # recv from the replica's own tp peer
    assert (r2[3].group_id, r3[3].group_id) == ("3", "4")      # dp groups span the replicas: themselves
    assert r2[0].peer == 0 and r2[4].peer == 0                 # the world's root and the dp root stay rank 0
    assert r3[4].peer == 1
    assert r2[0].payload == "" and full.nodes[0][0].payload == "abc"  # other replicas' values were not collected
    assert full.summaries[2].losses == () and full.summaries[2].peak_memory_bytes == 64
    assert full.meta["templates"] == "dp" and full.meta["num_replicas"] == "2"
    assert validate(full) == []


def test_templated_graph_round_trips_and_reads_expanded(tmp_path):
    templated = _templated()
    out = write_graph(templated, tmp_path / "bare")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "rank-00000.pb", "rank-00001.pb"]
    assert read_graph(out, expand=False) == templated
    assert read_graph(out) == expand(templated)


def test_a_template_map_that_contradicts_itself_is_refused(tmp_path):
    templated = _templated()
    tmap = templated.templates
    bad = dataclasses.replace(tmap, template_of=(0, 1, 1, 0))
    out = write_graph(dataclasses.replace(templated, templates=bad), tmp_path / "bare")
    with pytest.raises(RunDirError, match="template map sends rank 2 to template 1"):
        read_graph(out)


def test_a_group_no_rank_saw_gets_a_replica_suffix(caplog):
    perms = dp_permutations({"pp": 1, "dp": 2, "cp": 1, "tp": 2}, MESH)
    tp = GroupInfo("1", (0, 1), "mesh_tp")
    tmap, groups = build_template_map(perms, [tp], [tp])
    assert tmap.group_maps[1] == {"1": "1@dp1"} and groups["1@dp1"].ranks == (2, 3)
    assert "no rank saw the group of ranks [2, 3]" in caplog.text
