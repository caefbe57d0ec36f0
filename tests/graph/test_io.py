"""A graph directory round-trips exactly, and every kind of damage is reported by file name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from prism.core.errors import RunDirError
from prism.graph import SCHEMA_VERSION, Graph, parse_graph, read_graph, write_graph
from prism.graph._pb import prism_trace_pb2 as pb
from prism.graph.io import verify_graph

pytestmark = pytest.mark.timeout(60)

EVERY_FIELD = """
graph world_size=3 kind=bare job_name=io%20test
meta seed=7
group 0 ranks=0,1,2 desc=default_pg
group ep ranks=0,2
r0#0 COMP step=0 t=0+1000
r0#1 COLL all_to_all gep:0 1000B f32[16,16] out[20,16] in_splits=4,12 out_splits=5,15 async @a.py:3 payload=ff00
r0#2 WAIT #1 d=30
r0#3 SEND g0:0 ->1 tag=4 64KiB bf16[32,1024] t=900+40
r0#4 COLL broadcast g0:0 root=0 i64[] d=-1
r0#5 MARK step_end step=0 t=5000+0
r1#0 RECV g0:0 <-0 64KiB bf16[32,1024] async
r1#1 COLL broadcast g0:0 root=0 i64[]
r2#0 COLL all_gather gep:0 f32[4] out[4][4] sum
summary r0 step_times_ns=5000 losses=2.5,0.1 peak_memory_bytes=4096 measured_peak_memory_bytes=2048 memory_source=tracked
summary r2 exit_code=1
"""


@pytest.fixture
def graph() -> Graph:
    return parse_graph(EVERY_FIELD)


def _write_manifest(out: Path, manifest: pb.Manifest) -> None:
    """Write an edited manifest with its own checksum made valid again (the field holds the
    sha256 of the manifest serialized with the field empty), as a deliberate editor would."""
    manifest.sha256 = ""
    manifest.sha256 = hashlib.sha256(manifest.SerializeToString(deterministic=True)).hexdigest()
    (out / "manifest.pb").write_bytes(manifest.SerializeToString(deterministic=True))


def test_round_trip_keeps_every_field(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "bare")
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.pb",
        "rank-00000.pb",
        "rank-00001.pb",
        "rank-00002.pb",
    ]
    assert read_graph(out) == graph


def test_round_trip_of_golden_graphs(tmp_path: Path, two_rank_all_reduce: Graph, pipeline_2stage: Graph) -> None:
    for g in (two_rank_all_reduce, pipeline_2stage):
        assert read_graph(write_graph(g, tmp_path / g.job_name)) == g


def test_manifest_lists_each_rank_file_with_its_sha256(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    manifest = pb.Manifest.FromString((out / "manifest.pb").read_bytes())
    assert manifest.schema_version == SCHEMA_VERSION
    assert manifest.world_size == 3
    assert [(f.rank, f.file_name, f.num_nodes) for f in manifest.rank_files] == [
        (0, "rank-00000.pb", 6),
        (1, "rank-00001.pb", 2),
        (2, "rank-00002.pb", 1),
    ]
    for f in manifest.rank_files:
        assert f.sha256 == hashlib.sha256((out / f.file_name).read_bytes()).hexdigest()


def test_rewrite_replaces_the_directory_whole(tmp_path: Path, graph: Graph) -> None:
    out = tmp_path / "g"
    write_graph(graph, out)
    small = parse_graph("r0#0 COMP d=5\n")
    write_graph(small, out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.pb", "rank-00000.pb"]
    assert read_graph(out) == small
    assert [p.name for p in tmp_path.iterdir()] == ["g"]  # no temporary leftovers


def test_corrupt_rank_file_names_the_file(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    victim = out / "rank-00001.pb"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match=r"rank-00001\.pb: sha256 .* does not match manifest\.pb"):
        read_graph(out)


def test_missing_rank_file_names_the_file(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    (out / "rank-00002.pb").unlink()
    with pytest.raises(RunDirError, match=r"rank-00002\.pb: rank 2's file .* is missing"):
        read_graph(out)


def test_missing_manifest_and_missing_directory(tmp_path: Path, graph: Graph) -> None:
    with pytest.raises(RunDirError, match="graph directory does not exist"):
        read_graph(tmp_path / "nowhere")
    out = write_graph(graph, tmp_path / "g")
    (out / "manifest.pb").unlink()
    with pytest.raises(RunDirError, match=r"manifest\.pb: the graph manifest is missing"):
        read_graph(out)


def test_wrong_schema_version_in_manifest_names_it(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    manifest = pb.Manifest.FromString((out / "manifest.pb").read_bytes())
    manifest.schema_version = SCHEMA_VERSION + 1
    _write_manifest(out, manifest)
    with pytest.raises(RunDirError, match=rf"manifest\.pb: schema_version {SCHEMA_VERSION + 1}, but this prism reads"):
        read_graph(out)


def test_wrong_schema_version_in_rank_file_names_it(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    rank_file = pb.RankFile.FromString((out / "rank-00000.pb").read_bytes())
    rank_file.schema_version = 99
    data = rank_file.SerializeToString(deterministic=True)
    (out / "rank-00000.pb").write_bytes(data)
    manifest = pb.Manifest.FromString((out / "manifest.pb").read_bytes())
    manifest.rank_files[0].sha256 = hashlib.sha256(data).hexdigest()
    manifest.rank_files[0].size_bytes = len(data)
    _write_manifest(out, manifest)
    with pytest.raises(RunDirError, match=r"rank-00000\.pb: schema_version 99"):
        read_graph(out)


def test_node_payload_checksum_is_checked(tmp_path: Path, graph: Graph) -> None:
    """A rank file re-signed in the manifest but with edited nodes still fails its own checksum."""
    out = write_graph(graph, tmp_path / "g")
    rank_file = pb.RankFile.FromString((out / "rank-00000.pb").read_bytes())
    rank_file.nodes[0].duration_ns = 1
    data = rank_file.SerializeToString(deterministic=True)
    (out / "rank-00000.pb").write_bytes(data)
    manifest = pb.Manifest.FromString((out / "manifest.pb").read_bytes())
    manifest.rank_files[0].sha256 = hashlib.sha256(data).hexdigest()
    manifest.rank_files[0].size_bytes = len(data)
    _write_manifest(out, manifest)
    with pytest.raises(RunDirError, match=r"rank-00000\.pb: node payload checksum mismatch"):
        read_graph(out)


def test_garbage_manifest_names_the_file(tmp_path: Path, graph: Graph) -> None:
    out = write_graph(graph, tmp_path / "g")
    (out / "manifest.pb").write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(RunDirError, match=r"manifest\.pb: corrupt or truncated Manifest"):
        read_graph(out)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_verify_graph_names_a_damaged_rank_file_without_parsing_nodes(tmp_path: Path, graph: Graph, damage) -> None:
    write_graph(graph, tmp_path / "g")
    verify_graph(tmp_path / "g")  # an intact graph passes
    path = tmp_path / "g" / "rank-00001.pb"
    data = path.read_bytes()
    if damage == "remove":
        path.unlink()
    else:
        path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(RunDirError, match=r"rank-00001\.pb: (truncated|sha256 .* does not match manifest\.pb|rank 1.s file .* is missing)"):
        verify_graph(tmp_path / "g")


def test_a_summary_written_before_the_measured_peak_existed_reads_it_as_unknown() -> None:
    from prism.graph.io import _summary_from_pb

    old = pb.RankSummary.FromString(pb.RankSummary(rank=1, peak_memory_bytes=4096).SerializeToString())
    s = _summary_from_pb(old)
    assert (s.peak_memory_bytes, s.measured_peak_memory_bytes) == (4096, -1)
    assert _summary_from_pb(pb.RankSummary(rank=1, measured_peak_memory_bytes=0)).measured_peak_memory_bytes == 0
