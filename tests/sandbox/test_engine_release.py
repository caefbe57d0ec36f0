"""An engine drops its references to an op's tensors before it completes the op's future, so a
tensor that only the op still holds — a pipeline stage's sent gradient, which the schedule drops
once the send is waited — is gone when the script wakes, as in a plain gloo run. Dropped after,
it lived on for as long as the engine's thread took to run again, and counted in the rank's peak
or not depending on scheduling (issue 12: pp rank 3's 163,396 vs 163,140 B)."""

import threading
import weakref

import pytest
import torch
import torch.distributed as dist

from prism.graph.records import CommOp
from prism.sandbox.engines.base import CommRequest, GroupHandle
from prism.sandbox.engines.passthrough import PassthroughEngine, _unowned

pytestmark = pytest.mark.timeout(120)


def _pair(monkeypatch=None, memory: str = "tracked", timeout_s: float = 60) -> list[tuple[PassthroughEngine, GroupHandle]]:
    """Two ranks of one real gloo group in this process (gloo's rendezvous needs both at once)."""
    if monkeypatch is not None:
        monkeypatch.setenv("PRISM_MEMORY", memory)
    store = dist.HashStore()
    pairs = [(PassthroughEngine(timeout_s=timeout_s), GroupHandle("0", (0, 1), r)) for r in range(2)]
    threads = [threading.Thread(target=e.create_group, args=(g, store)) for e, g in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return pairs


@pytest.mark.parametrize("memory", ["tracked", "rss"])
def test_passthrough_drops_a_sent_tensor_before_the_send_completes(monkeypatch, memory):
    """Both passes: the memory pass (tracked: gloo gets aliases) and the timed pass (rss: a send or
    recv is completed by its stream's helper with no second future)."""
    (sender, g0), (receiver, g1) = _pair(monkeypatch, memory)
    for seq in range(20):  # before the fix, most sends lost this race on an idle machine
        received = torch.zeros(64)
        recv = receiver.submit(CommRequest(CommOp.RECV, g1, inputs=[], outputs=[received], peer=0, seq=seq))
        sent = torch.full((64,), float(seq))
        storage = weakref.ref(sent.untyped_storage())
        send = sender.submit(CommRequest(CommOp.SEND, g0, inputs=[sent], outputs=[], peer=1, seq=seq))
        del sent  # the script keeps only the work, as Schedule1F1B does with its last gradient send
        send.wait()
        assert storage() is None, f"send {seq}: the engine still held the sent tensor when the script woke"
        assert recv.wait()[0] is received, "a recv's future holds its output tensors, as finish returned them"
        assert received.eq(float(seq)).all()
    for engine in (sender, receiver):
        engine.shutdown()


def test_passthrough_recv_error_reaches_the_script(monkeypatch):
    """A backend error of a gloo recv (here: gloo's timeout, the peer never sends) fails the
    script's future on the timed pass's path (no ``finish``), as it did through ``finish``."""
    (sender, _), (receiver, g1) = _pair(monkeypatch, "rss", timeout_s=1)
    recv = receiver.submit(CommRequest(CommOp.RECV, g1, inputs=[], outputs=[torch.zeros(64)], peer=0, seq=0))
    with pytest.raises(RuntimeError, match="[Tt]imed out"):
        recv.wait()
    for engine in (sender, receiver):
        engine.shutdown()


def test_gloo_holds_no_collective_tensor_of_the_script_once_the_op_completed():
    """ProcessGroupGloo's worker drops a collective's work only after completing its future: given
    the script's own tensors, a freed one was still alive at the next allocation in 2-16 % of the
    ops (bench/gloo_hold.py). Given the engine's non-owning aliases, gloo keeps none alive."""
    pairs = _pair()
    gloo = [e._gloo[g.group_id] for e, g in pairs]
    for seq in range(200):
        tensors = [torch.full((64,), float(r + 1)) for r in range(2)]
        storages = [weakref.ref(t.untyped_storage()) for t in tensors]
        aliases = [_unowned(CommRequest(CommOp.ALL_REDUCE, g, inputs=[t], outputs=[t])).inputs[0]
                   for (_, g), t in zip(pairs, tensors)]
        futures = [pg.allreduce([a]).get_future() for pg, a in zip(gloo, aliases)]
        for f in futures:
            f.wait()
        assert [t.eq(3.0).all().item() for t in tensors] == [True, True]
        del tensors, f, futures
        assert [s() for s in storages] == [None, None], f"all_reduce {seq}: gloo still held the script's tensor"
        del aliases
    for engine, _ in pairs:
        engine.shutdown()
