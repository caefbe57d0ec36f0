"""The duration estimator: nearest records of the same kind, locally weighted regression on bytes."""

from __future__ import annotations

import pytest

from prism.graph import parse_graph
from prism.graph.estimate import CommFeatures, DurationEstimator, features_of, samples_from_graph


def feat(kind="COLLECTIVE:all_reduce", size=1024, position=0, rank=0, group_size=2, cross=False, peer_dir=0,
         first=False) -> CommFeatures:
    return CommFeatures(kind=kind, group_size=group_size, cross_node=cross, size_bytes=size, position=position,
                        peer_dir=peer_dir, rank=rank, first_step=first)


def test_identical_records_give_their_duration():
    est = DurationEstimator([(feat(position=3), 5_000), (feat(position=3, rank=1), 5_000), (feat(position=9), 90_000)],
                            k=2)
    assert est.estimate(feat(position=3)) == 5_000


def test_duration_follows_bytes_between_neighbours():
    # duration = 1 µs + 1 ns per byte: the local line recovers a size in between exactly.
    samples = [(feat(size=s), 1_000 + s) for s in (1 << 10, 1 << 12, 1 << 14, 1 << 16)]
    assert DurationEstimator(samples, k=4).estimate(feat(size=1 << 13)) == pytest.approx(1_000 + (1 << 13), rel=1e-6)


def test_other_kinds_are_never_neighbours():
    est = DurationEstimator([(feat(kind="RECV:recv"), 7)])
    assert est.estimate(feat(kind="COLLECTIVE:all_reduce")) is None
    assert est.estimate(feat(kind="RECV:recv", size=10 << 20)) == 7


def test_first_step_and_group_size_keep_their_own_neighbours():
    samples = [(feat(first=True), 4_000_000_000), *((feat(position=p), 10_000) for p in range(4)),
               (feat(group_size=8), 80_000)]
    est = DurationEstimator(samples, k=3)
    assert est.estimate(feat(position=1)) == 10_000
    assert est.estimate(feat(group_size=8)) > 10_000


GRAPH = """\
graph world_size=2 kind=real
group 0 ranks=0,1
r0#0 COLL all_reduce g0:0 1KiB f32[256] sum step=0 t=0+5000
r0#1 COLL all_reduce g0:1 1KiB f32[256] sum step=1 t=9000+3000
r1#0 COLL all_reduce g0:0 1KiB f32[256] sum step=0 t=0+4000
r1#1 COLL all_reduce g0:1 1KiB f32[256] sum step=1 t=9000+2000
"""


def test_samples_from_a_graph_skip_withheld_records():
    g = parse_graph(GRAPH)
    samples = samples_from_graph(g, ranks_per_node=2, exclude=frozenset({(0, 1)}))
    assert sorted(d for _, d in samples) == [2000, 4000, 5000]
    node = g.nodes[0][1]
    f = features_of(node, members=(0, 1), ranks_per_node=2, position=0)
    assert (f.kind, f.group_size, f.cross_node, f.first_step, f.size_bytes) == ("COLLECTIVE:all_reduce", 2, False,
                                                                                False, 1024)
    # rank 1's record of the same step is the nearest: 2 µs, not step 0's 4-5 µs
    assert DurationEstimator(samples, k=1).estimate(f) == 2000
