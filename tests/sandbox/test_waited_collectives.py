"""Record's timed pass: a gloo collective on the script's CPU tensors is completed by the thread
that waits for it, as a plain gloo run's ``Work.wait`` returns on that thread (docs/timing.md,
"Messages the script waits for"); a consumer that takes the future instead (DDP's reducer) or a
later op of the same group hands it to the backend's own completion, so every op completes exactly
once, with ``avg`` divided and the completion stamped, whoever completes it."""

import threading
import time

import pytest
import torch

from prism.graph.records import CommOp
from prism.sandbox.engines.base import DONE_NS, CommRequest

from .test_engine_release import _pair

pytestmark = pytest.mark.timeout(120)


def _all_reduce(engines, values, *, reduce_op="sum", seq=0):
    tensors = [torch.full((8,), float(v)) for v in values]
    requests = [CommRequest(CommOp.ALL_REDUCE, g, inputs=[t], outputs=[t], reduce_op=reduce_op, seq=seq)
                for (_, g), t in zip(engines, tensors, strict=True)]
    futures = [e.submit(r) for (e, _), r in zip(engines, requests, strict=True)]
    return futures, tensors, requests


def _completed_on(future) -> list:
    where: list = []
    future.add_done_callback(lambda _f: where.append(threading.get_ident()))
    return where


def _eventually(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def _shutdown(engines) -> None:
    for engine, _ in engines:
        engine.shutdown()


def test_a_collective_waited_at_once_completes_on_the_waiting_thread(monkeypatch):
    engines = _pair(monkeypatch, "rss")
    for seq, op in enumerate(("sum", "avg", "max")):
        futures, tensors, requests = _all_reduce(engines, (2, 6), reduce_op=op, seq=seq)
        where = [_completed_on(f) for f in futures]
        assert not any(where), "nothing completes a collective before someone waits for it or asks"
        for f, t in zip(futures, tensors, strict=True):
            assert f.wait()[0] is t
        expected = {"sum": 8.0, "avg": 4.0, "max": 6.0}[op]
        assert all(t.eq(expected).all() for t in tensors), (op, tensors)
        assert where == [[threading.get_ident()]] * 2
        assert all(r.extra[DONE_NS] > 0 for r in requests)
    _shutdown(engines)


def test_a_collective_whose_future_is_taken_completes_without_a_wait(monkeypatch):
    """DDP's reducer never waits: it chains on the future, which the backend's thread completes."""
    engines = _pair(monkeypatch, "rss")
    futures, tensors, requests = _all_reduce(engines, (1, 5), reduce_op="avg")
    chained = [f.then(lambda f: f.value()[0].sum().item()) for f in futures]  # hands the op over
    _eventually(lambda: all(c.done() for c in chained), "the backend completed both all_reduces")
    assert [c.value() for c in chained] == [24.0, 24.0], "avg divided once, before the consumer ran"
    assert all(r.extra[DONE_NS] > 0 for r in requests)
    assert all(f.wait()[0] is t for f, t in zip(futures, tensors, strict=True)), "a later wait returns the outputs"
    _shutdown(engines)


def test_an_earlier_collective_of_the_group_completes_when_the_group_moves_on(monkeypatch):
    """An op issued async and waited after the group's next op: the next op hands it over, so it
    completes though nobody has waited for it yet, and both waits return their own values."""
    engines = _pair(monkeypatch, "rss")
    first, first_tensors, _ = _all_reduce(engines, (1, 2), seq=0)
    where = _completed_on(first[0])
    second, second_tensors, _ = _all_reduce(engines, (10, 20), seq=1)
    # completed before anyone waited for it; by the backend's thread, or by this one when gloo had
    # finished it before the next op came (torch runs a finished future's callback inline)
    _eventually(lambda: where, "the group's next op handed the first one to the backend")
    for f in (*second, *first):
        f.wait()
    assert all(t.eq(3.0).all() for t in first_tensors) and all(t.eq(30.0).all() for t in second_tensors)
    _shutdown(engines)


def test_a_flat_all_gather_without_a_backend_future_is_completed_by_the_groups_helper(monkeypatch):
    engines = _pair(monkeypatch, "rss")
    outputs = [torch.zeros(8) for _ in engines]
    futures = [e.submit(CommRequest(CommOp.ALL_GATHER, g, inputs=[torch.full((4,), float(g.group_rank + 1))],
                                    outputs=[out], flat=True, seq=0))
               for (e, g), out in zip(engines, outputs, strict=True)]
    _eventually(lambda: all(f.done() for f in futures), "a poll hands the all_gathers over, and they complete")
    expected = torch.tensor([1.0] * 4 + [2.0] * 4)
    assert all(torch.equal(out, expected) for out in outputs)
    _shutdown(engines)


def test_a_failed_collective_fails_its_waiter_and_its_consumer(monkeypatch):
    """gloo's timeout (the peer never joins) reaches the waiting script, and a consumer of the
    future as an error, not as the op's tensors."""
    engines = _pair(monkeypatch, "rss", timeout_s=1)
    (engine, g), _ = engines
    waited = engine.submit(CommRequest(CommOp.ALL_REDUCE, g, inputs=[torch.ones(4)], outputs=[torch.ones(4)],
                                       reduce_op="sum", seq=0))
    with pytest.raises(RuntimeError, match="[Tt]imed out"):
        waited.wait()
    taken = engine.submit(CommRequest(CommOp.ALL_REDUCE, g, inputs=[torch.ones(4)], outputs=[torch.ones(4)],
                                      reduce_op="sum", seq=1))
    chained = taken.then(lambda f: f.value())
    _eventually(chained.done, "the backend's timeout failed the handed-over op")
    with pytest.raises(RuntimeError, match="timeout caused pair closure|[Tt]imed out"):  # the group broke above
        chained.value()
    _shutdown(engines)
