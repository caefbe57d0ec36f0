"""The real algorithms as schedules, and pruning them to a sandbox subset (pure, no torch)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.nccl_patches.reduction import ring_order
from prism.nccl_patches.schedule import (
    Algo,
    Geometry,
    LinkTraffic,
    Phase,
    chunk_numels,
    critical_path,
    full_schedule,
    link_traffic,
    neighbor_vranks,
    prune,
    ring_blocks,
    steps_touching,
    tree_fold_order,
    vranks_touching,
)
from tests.nccl_patches.cases import sandbox_subsets

pytestmark = pytest.mark.timeout(120)


def test_ring_all_reduce_of_four_ranks_step_by_step():
    steps = full_schedule(Algo.RING_ALL_REDUCE, Geometry(4, numel=8))
    first = [str(s) for s in steps if s.t == 0]
    assert first == ["t0 0->1 RS c3 2", "t0 1->2 RS c0 2", "t0 2->3 RS c1 2", "t0 3->0 RS c2 2"]
    # the last reduce step delivers each chunk to its owner, which finishes it
    assert [str(s) for s in steps if s.t == 2] == [
        "t2 0->1 RS c1 2 done", "t2 1->2 RS c2 2 done", "t2 2->3 RS c3 2 done", "t2 3->0 RS c0 2 done",
    ]
    # then each owner starts the all-gather with its own chunk
    assert [str(s) for s in steps if s.t == 3] == ["t3 0->1 AG c0 2", "t3 1->2 AG c1 2", "t3 2->3 AG c2 2", "t3 3->0 AG c3 2"]
    assert len(steps) == 4 * 2 * 3


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_reduce_steps_follow_the_collectors_reduction_order(n):
    steps = full_schedule(Algo.RING_ALL_REDUCE, Geometry(n, numel=n))
    for c in range(n):
        path = [s for s in steps if s.chunk == c and s.phase is Phase.REDUCE]
        visited = [path[0].src] + [s.dst for s in path]
        assert visited == ring_order(c, n)
        assert [s.completes for s in path] == [False] * (n - 2) + [True]
        gather = [s for s in steps if s.chunk == c and s.phase is Phase.GATHER]
        assert [gather[0].src] + [s.dst for s in gather] == [(c + k) % n for k in range(n)]


@given(n=st.integers(2, 64), numel=st.integers(0, 200))
@settings(max_examples=60, deadline=None)
def test_every_ring_link_carries_all_chunks_but_two_in_two_phases(n, numel):
    traffic = link_traffic(full_schedule(Algo.RING_ALL_REDUCE, Geometry(n, numel=numel)), itemsize=4)
    sizes = chunk_numels(numel, n)
    for r in range(n):
        nxt = (r + 1) % n
        expected_steps = sum(1 for c in range(n) if c != r and sizes[c]) + sum(1 for c in range(n) if c != nxt and sizes[c])
        expected_bytes = 4 * ((numel - sizes[r]) + (numel - sizes[nxt]))
        assert traffic.get((r, nxt), LinkTraffic()) == LinkTraffic(expected_bytes, expected_steps)
    assert set(traffic) <= {(r, (r + 1) % n) for r in range(n)}


def test_tree_is_a_binary_heap_reduced_bottom_up_then_broadcast_top_down():
    steps = full_schedule(Algo.TREE_ALL_REDUCE, Geometry(6, numel=10))
    assert [str(s) for s in steps] == [
        "t0 3->1 UP c0 10", "t0 4->1 UP c0 10", "t0 5->2 UP c0 10",
        "t1 1->0 UP c0 10", "t1 2->0 UP c0 10",
        "t2 0->1 DN c0 10", "t2 0->2 DN c0 10",
        "t3 1->3 DN c0 10", "t3 1->4 DN c0 10", "t3 2->5 DN c0 10",
    ]
    assert tree_fold_order(0, 6) == [1, 2]
    assert tree_fold_order(2, 7) == [5, 6]
    assert tree_fold_order(1, 9) == [4, 3]  # 4 is a leaf (arrives at t0), 3 has children (t1)


def test_chain_broadcast_and_direct_all_to_all():
    bcast = full_schedule(Algo.CHAIN_BROADCAST, Geometry(4, numel=3, root=2))
    assert [str(s) for s in bcast] == ["t0 2->3 AG c0 3", "t1 3->0 AG c0 3", "t2 0->1 AG c0 3"]
    rows = [[0, 1, 2], [3, 0, 0], [1, 1, 1]]  # rows[src][dst]
    a2a = full_schedule(Algo.DIRECT_ALL_TO_ALL, Geometry(3, block_numel=lambda s, d: rows[s][d] * 4))
    # the empty block 1->2 is not sent
    assert [str(s) for s in a2a] == [
        "t0 0->1 X c0 4", "t0 2->0 X c2 4", "t1 0->2 X c0 8", "t1 1->0 X c1 12", "t1 2->1 X c2 4",
    ]


def test_ring_blocks_wrap_around():
    assert ring_blocks(8, [0, 1, 5, 7]) == [(5,), (7, 0, 1)]
    assert ring_blocks(4, [0, 1, 2, 3]) == [(0, 1, 2, 3)]
    assert ring_blocks(6, [3]) == [(3,)]


def test_pruning_a_ring_keeps_the_links_around_each_block():
    sandbox = [2, 3, 6]
    steps = steps_touching(Algo.RING_ALL_REDUCE, Geometry(8, numel=16), sandbox)
    assert {(s.src, s.dst) for s in steps} == {(1, 2), (2, 3), (3, 4), (5, 6), (6, 7)}
    assert neighbor_vranks(steps, sandbox) == {1, 4, 5, 7}
    assert all(len([s for s in steps if (s.src, s.dst) == link]) == 14 for link in [(1, 2), (2, 3)])


ALGOS = [Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.RING_ALL_GATHER, Algo.CHAIN_BROADCAST,
         Algo.DIRECT_ALL_TO_ALL, Algo.P2P, Algo.TREE_ALL_REDUCE]


@st.composite
def pruning_cases(draw):
    n = draw(st.integers(2, 64))
    sandbox = draw(sandbox_subsets(n))
    algo = draw(st.sampled_from(ALGOS))
    seed = draw(st.integers(0, 10**6))
    root, peer = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    if peer == root:
        peer = (root + 1) % n
    geometry = Geometry(n, numel=draw(st.integers(0, 3 * n)), root=root, peer=peer,
                        block_numel=lambda s, d: (s * 7 + d * 3 + seed) % 5)
    return algo, geometry, sandbox


@given(pruning_cases())
@settings(max_examples=300, deadline=None)
def test_pruned_schedule_is_the_full_schedule_restricted_to_sandbox_links(case):
    algo, geometry, sandbox = case
    full = full_schedule(algo, geometry)
    pruned = steps_touching(algo, geometry, sandbox)
    assert pruned == prune(full, sandbox)
    # so every sandbox link carries exactly the real algorithm's bytes and steps
    real = link_traffic(full, itemsize=2)
    kept = link_traffic(pruned, itemsize=2)
    assert kept == {link: t for link, t in real.items() if set(link) & set(sandbox)}
    # and only neighbors of the sandbox need an endpoint
    touching = {r for s in full for r in (s.src, s.dst) if {s.src, s.dst} & set(sandbox)}
    assert neighbor_vranks(pruned, sandbox) == touching - set(sandbox)


def test_a_rank_outside_the_group_is_named():
    with pytest.raises(ValueError, match="group rank 9 is outside a group of 4"):
        steps_touching(Algo.RING_ALL_REDUCE, Geometry(4, numel=8), [9])


@pytest.mark.parametrize("algo", [Algo.RING_ALL_REDUCE, Algo.RING_ALL_GATHER, Algo.RING_REDUCE_SCATTER,
                                  Algo.TREE_ALL_REDUCE, Algo.CHAIN_BROADCAST, Algo.DIRECT_ALL_TO_ALL])
@pytest.mark.parametrize("numel", [3, 64])
def test_the_kept_neighbor_set_is_the_one_the_pruned_steps_give(algo, numel):
    # numel 3 < n: some chunks are empty, their steps absent, and so may be some neighbors.
    block = (lambda src, dst: (src + dst) % 3) if algo is Algo.DIRECT_ALL_TO_ALL else None
    g = Geometry(8, numel=numel, root=1, block_numel=block)
    for sandbox in ([2, 5], [0], [3, 4, 5]):
        want = neighbor_vranks(steps_touching(algo, g, sandbox), sandbox)
        assert vranks_touching(algo, g, sandbox) == want
        assert vranks_touching(algo, g, sandbox) == want  # the second answer comes from the cache


@pytest.mark.parametrize("algo", [Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.RING_ALL_GATHER,
                                  Algo.CHAIN_BROADCAST, Algo.TREE_ALL_REDUCE])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9])
@pytest.mark.parametrize("numel", [0, 3, 17, 64])
def test_the_critical_path_has_one_entry_per_step_of_the_full_schedule_its_largest_message(algo, n, numel):
    g = Geometry(n, numel, root=n // 2)
    by_t: dict[int, int] = {}
    for s in full_schedule(algo, g):
        by_t[s.t] = max(by_t.get(s.t, 0), s.numel)
    want = tuple(by_t[t] for t in sorted(by_t))
    for rank in range(n):
        assert critical_path(algo, g, rank) == want, (algo, n, numel, rank)


def test_the_critical_path_of_an_all_to_all_takes_the_ranks_own_row_and_column_per_round():
    blocks = [[0, 1, 2, 3], [4, 0, 6, 0], [8, 9, 0, 11], [12, 0, 14, 0]]  # blocks[src][dst]
    g = Geometry(4, block_numel=lambda src, dst: blocks[src][dst])
    # round k: rank r sends to r+k and receives from r-k; a round with neither message is no step
    assert critical_path(Algo.DIRECT_ALL_TO_ALL, g, 1) == (max(6, 1), max(4, 9))  # round 2: 0 and 0
    assert critical_path(Algo.DIRECT_ALL_TO_ALL, g, 3) == (max(12, 11), max(14, 3))
    assert critical_path(Algo.DIRECT_ALL_TO_ALL, g, 0) == (max(1, 12), max(2, 8), max(3, 4))
    assert critical_path(Algo.P2P, Geometry(2, 5, root=0, peer=1), 0) == ()
