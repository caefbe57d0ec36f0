"""The coordinator service over a real gRPC server, driven by client threads (no processes)."""

import threading

import pytest
import torch

from prism.coordinator.cuda_checkpoint import NullSwitcher
from prism.coordinator.payloads import PayloadPolicy, PayloadStore, load_payload
from prism.coordinator.state import RunState
from prism.rpc import MAX_CHUNK_BYTES, CommHeader, CoordinatorClient, CoordinatorServer, FetchError, TensorMeta

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def served(tmp_path):
    made = []

    def make(world, slots, token="", policy=None):
        state = RunState(world, slots, switcher=NullSwitcher(), payloads=PayloadStore(tmp_path / "payloads"),
                         policy=policy or PayloadPolicy(True, 64, frozenset()))
        server = CoordinatorServer(state, token=token)
        made.append((state, server))
        return state, server

    yield make
    for state, server in made:
        state.stop("test over")
        server.stop()


def header(rank, op_index, op, t_in, t_out, world, seq=0, **kw):
    return CommHeader(rank=rank, op_index=op_index, op=op, group_id="0", group_ranks=tuple(range(world)), seq=seq,
                      inputs=tuple(TensorMeta.of(t) for t in t_in), outputs=tuple(TensorMeta.of(t) for t in t_out),
                      **kw)


def test_large_all_reduce_streams_in_chunks_and_respects_the_slot_limit(served):
    world, slots = 3, 1
    state, server = served(world, slots)
    assert sorted(state.take_spawns()) == [(0, 0)]  # only one slot: one rank may start
    big = 3 * MAX_CHUNK_BYTES // 4 + 17  # > 2 MiB per rank, crosses chunk borders
    results = {}

    def rank_main(r):
        c = CoordinatorClient(server.address)
        c.register(r, 1000 + r)
        t = torch.full((big,), float(r + 1))
        c.submit(header(r, 0, "all_reduce", [t], [t], world, reduce_op="sum"), [t])
        results[r] = c.fetch(r, 0)[0]
        c.finish(r)
        c.close()

    threads = {0: threading.Thread(target=rank_main, args=(0,))}
    threads[0].start()
    started = {0}
    while len(started) < world:  # play the orchestrator: start ranks as they are granted
        for rank, _slot in state.take_spawns():
            threads[rank] = threading.Thread(target=rank_main, args=(rank,))
            threads[rank].start()
            started.add(rank)
    for t in threads.values():
        t.join(30)
    assert all(torch.equal(results[r], torch.full((big,), 6.0)) for r in range(world))
    assert state.max_active == 1
    assert state.stats.num_collectives == 1
    assert state.switcher.stats.num_swaps_out == state.switcher.stats.num_swaps_in == world - 1


def test_send_is_buffered_and_the_recv_gets_it_later(served, tmp_path):
    state, server = served(2, 2)
    c0, c1 = CoordinatorClient(server.address), CoordinatorClient(server.address)
    c0.register(0, 0), c1.register(1, 0)
    t = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    assert c0.submit(header(0, 0, "send", [t], [], 2, peer=1), [t]) is True
    out = torch.empty(2, 2, dtype=torch.int64)
    assert c1.submit(header(1, 0, "recv", [], [out], 2, peer=0), []) is True
    got = c1.fetch(1, 0)[0]
    assert torch.equal(got, t)
    (entry,) = state.payloads.index.values()
    assert torch.equal(load_payload(tmp_path / "payloads", entry["outputs"])[0], t)


def test_mismatched_ops_fail_every_waiter_with_a_report(served):
    state, server = served(2, 2)
    c0, c1 = CoordinatorClient(server.address), CoordinatorClient(server.address)
    t = torch.ones(4)
    c0.submit(header(0, 0, "all_reduce", [t], [t], 2, reduce_op="sum", call_site="a.py:1"), [t])
    c1.submit(header(1, 0, "barrier", [], [], 2, call_site="a.py:2"), [])
    with pytest.raises(FetchError, match=r"rank 1 issued barrier"):
        c0.fetch(0, 0)
    assert "collective mismatch" in str(state.error)


def test_a_wrong_token_is_refused(served):
    _state, server = served(1, 1, token="s3cret")
    with pytest.raises(Exception, match="prism-token"):
        CoordinatorClient(server.address, token="nope").register(0, 1)
    assert CoordinatorClient(server.address, token="s3cret").register(0, 1) == 1


def test_with_a_slot_for_every_rank_a_rank_waits_for_a_late_peer_without_swapping(served):
    # K = W: nobody needs the slot of a rank whose peer is late, so its device context stays (a swap
    # is a CUDA checkpoint of the whole process: FSDP2's 700 ops were 570 swaps out and back in).
    world = 2
    state, server = served(world, world)
    assert sorted(state.take_spawns()) == [(0, 0), (1, 1)]
    results = {}

    def rank_main(r, before_submit):
        before_submit.wait(30)
        c = CoordinatorClient(server.address)
        c.register(r, 1000 + r)
        for i in range(3):
            t = torch.full((8,), float(r + i))
            c.submit(header(r, i, "all_reduce", [t], [t], world, seq=i, reduce_op="sum"), [t])
            results[r, i] = c.fetch(r, i)[0]
        c.finish(r)
        c.close()

    early, late = threading.Event(), threading.Event()
    early.set()
    threads = [threading.Thread(target=rank_main, args=(0, early)), threading.Thread(target=rank_main, args=(1, late))]
    for t in threads:
        t.start()
    while state.stats.num_waited_in_place == 0:  # rank 0 waits for rank 1 at the first op
        threading.Event().wait(0.01)
    late.set()
    for t in threads:
        t.join(30)
    assert all(torch.equal(results[r, i], torch.full((8,), float(2 * i + 1))) for r in range(world) for i in range(3))
    assert state.switcher.stats.num_swaps_out == state.switcher.stats.num_swaps_in == 0
    assert state.stats.num_context_switches == 0
    assert state.stats.num_waited_in_place >= 1
