"""What the per-op cost cuts must keep: schedules built once stay the same, a barrier's record is
shared read-only, and a collective's traffic is its own messages even while another thread uses
the same transport (issue 11, the emulator's own cost per op)."""

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from prism.nccl_patches import Transport, link_traffic, run_sandbox_side
from prism.nccl_patches.schedule import Algo, Geometry, steps_touching
from prism.nccl_patches.vplan import barrier_record

pytestmark = pytest.mark.timeout(60)


def test_a_cached_schedule_is_a_fresh_list_equal_to_the_first():
    g = Geometry(8, numel=64)
    first = steps_touching(Algo.RING_ALL_REDUCE, g, [3, 1])
    first.clear()  # a caller that changes its list changes nobody else's
    again = steps_touching(Algo.RING_ALL_REDUCE, Geometry(8, numel=64), (1, 3))
    assert again and again == steps_touching(Algo.RING_ALL_REDUCE, g, [1, 3, 3])
    assert {s.src for s in again} | {s.dst for s in again} >= {1, 3}
    with pytest.raises(ValueError, match="outside a group of 8"):
        steps_touching(Algo.RING_ALL_REDUCE, g, [8])


def test_all_to_all_schedules_follow_their_block_sizes():
    sizes = {}
    g = lambda k: Geometry(3, block_numel=lambda s, d: k * (s + 1))  # noqa: E731 - a new geometry per k
    for k in (1, 2):
        sizes[k] = {(s.src, s.dst): s.numel for s in steps_touching(Algo.DIRECT_ALL_TO_ALL, g(k), [0])}
    assert sizes[2] == {key: 2 * v for key, v in sizes[1].items()}


def test_barrier_records_are_built_once_per_group_shape():
    a, b = barrier_record(4, [2, 1]), barrier_record(4, (1, 2))
    assert a is b and a.sandbox == (1, 2)
    assert barrier_record(4, [1]) is not a


def _endpoints(n: int) -> list[Transport]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    out: list[Transport | None] = [None] * n

    def join(e: int) -> None:  # a client each: one client serializes its requests (a wait holds up a set)
        client = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=30))
        out[e] = Transport.connect(client, e, n, {r: r for r in range(n)}, timeout_s=30, prefix="t")

    threads = [threading.Thread(target=join, args=(e,)) for e in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(out), "transports did not connect"
    return out  # type: ignore[return-value]


def test_a_collectives_traffic_is_its_own_while_another_thread_shares_the_transport():
    t0, t1 = _endpoints(2)
    data = [torch.arange(10, dtype=torch.float32) * (r + 1) for r in range(2)]
    results: dict[int, object] = {}
    other_sent = threading.Event()
    num_other = 200

    def rank(r: int, transport: Transport) -> None:
        results[r] = run_sandbox_side(transport, Algo.RING_ALL_REDUCE, r, data[r], group_size=2,
                                      reduce_op="sum", tag_base=0, timeout_s=30)

    def other() -> None:  # unrelated messages on the same transport, on other tags, meanwhile
        for k in range(num_other):
            t0.send(torch.ones(1000), 0, 1, 10_000 + k).wait()
        other_sent.set()

    def drain() -> None:
        for k in range(num_other):
            t1.recv(torch.empty(1000), 0, 1, 10_000 + k).wait()

    threads = [threading.Thread(target=f) for f in (other, drain)]
    threads += [threading.Thread(target=rank, args=(r, t)) for r, t in ((0, t0), (1, t1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert other_sent.is_set() and set(results) == {0, 1}
    want = data[0] + data[1]
    for r in (0, 1):
        res = results[r]
        assert torch.equal(res.output, want)
        assert res.traffic == link_traffic(steps_touching(Algo.RING_ALL_REDUCE, Geometry(2, numel=10), [r]), 4)
    assert t0.traffic()[(0, 1)].num_bytes > results[0].traffic[(0, 1)].num_bytes  # the transport saw both


def test_a_direct_all_to_all_over_gloo_posts_every_round_before_it_waits():
    """gloo's alltoallv posts all its sends and receives before waiting for any, so a peer may take
    the rounds in any order. Here the peer (group ranks 1-3 on one endpoint) goes through them
    backwards, one at a time: a sandbox side that waited for round 0's message before posting round
    1's would never get it (the peer first waits for the last round's)."""
    n, block = 4, 2
    sandbox, peer = _endpoints(2)
    # endpoint 0 hosts group rank 0 (the sandbox rank), endpoint 1 hosts group ranks 1..3
    sandbox.endpoint_of = peer.endpoint_of = {0: 0, 1: 1, 2: 1, 3: 1}
    data = torch.arange(n * block, dtype=torch.float32)  # rank 0's input: block k goes to rank k
    result: dict[str, object] = {}

    def run_sandbox() -> None:
        result["out"] = run_sandbox_side(sandbox, Algo.DIRECT_ALL_TO_ALL, 0, data, group_size=n, timeout_s=20)

    def play_peer() -> None:
        got = {}
        for k in reversed(range(1, n)):  # round k-1: rank 0 sends to rank k, rank n-k sends to rank 0
            src = n - k
            send = peer.send(torch.full((block,), float(src)), src, 0, (k - 1) * n + 0)
            buf = torch.empty(block)
            assert peer.recv(buf, 0, k, (k - 1) * n + k).wait(datetime.timedelta(seconds=20))
            got[k] = buf
            send.wait()
        result["peer"] = got

    threads = [threading.Thread(target=f) for f in (run_sandbox, play_peer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert set(result) == {"out", "peer"}, "the all-to-all did not complete"
    want = torch.cat([data[:block]] + [torch.full((block,), float(j)) for j in range(1, n)])
    assert torch.equal(result["out"].output, want)
    assert {k: v.tolist() for k, v in result["peer"].items()} == {k: data[k * block:(k + 1) * block].tolist()
                                                                  for k in range(1, n)}


def test_a_four_rank_ring_over_gloo_keeps_its_values_and_traffic():
    # Four ranks of one ring over real gloo transports, six ring steps: every rank ends with the
    # sum and counts its own messages.
    n = 4
    transports = _endpoints(n)
    data = [torch.arange(11, dtype=torch.float32) * (r + 1) for r in range(n)]
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        results[r] = run_sandbox_side(transports[r], Algo.RING_ALL_REDUCE, r, data[r], group_size=n,
                                      reduce_op="sum", tag_base=0, timeout_s=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert set(results) == set(range(n)), "the ring did not complete"
    want = sum(data)
    for r in range(n):
        assert torch.equal(results[r].output, want)
        assert results[r].traffic == link_traffic(steps_touching(Algo.RING_ALL_REDUCE, Geometry(n, numel=11), [r]), 4)
