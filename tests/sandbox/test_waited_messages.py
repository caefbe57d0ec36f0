"""Record's timed pass: a gloo send/recv is completed by the thread that waits for it, on that
thread, as in a plain gloo run (docs/timing.md, "Messages the script waits for"); whatever else
asks for its completion, or a stream that moves on before the wait, or the end of the program,
hands it to the stream's helper thread, so every op completes exactly once and none waits for a
wait that never comes."""

import threading
import time

import pytest
import torch

from prism.graph.records import CommOp
from prism.sandbox.engines.base import DONE_NS, CommRequest

from .test_engine_release import _pair

pytestmark = pytest.mark.timeout(120)


def _message(sender, g0, receiver, g1, seq: int, value: float):
    received = torch.zeros(16)
    recv_req = CommRequest(CommOp.RECV, g1, inputs=[], outputs=[received], peer=0, seq=seq)
    recv = receiver.submit(recv_req)
    send = sender.submit(CommRequest(CommOp.SEND, g0, inputs=[torch.full((16,), value)], outputs=[], peer=1, seq=seq))
    return send, recv, received, recv_req


def _completion_thread(future) -> list:
    """The ident of the thread whose completion ran the future's callbacks (filled once it has)."""
    where: list = []
    future.add_done_callback(lambda _f: where.append(threading.get_ident()))
    return where


def _shutdown(*engines) -> None:
    for engine in engines:
        engine.shutdown()


def test_the_waiting_thread_completes_the_message_and_stamps_it(monkeypatch):
    (sender, g0), (receiver, g1) = _pair(monkeypatch, "rss")
    for seq in range(5):
        send, recv, received, recv_req = _message(sender, g0, receiver, g1, seq, float(seq))
        on_send, on_recv = _completion_thread(send), _completion_thread(recv)
        assert not on_recv, "nothing completes a message before someone waits for it or asks"
        send.wait()
        assert recv.wait()[0] is received and received.eq(float(seq)).all()
        assert on_send == on_recv == [threading.get_ident()]
        assert recv_req.extra[DONE_NS] > 0
    _shutdown(sender, receiver)


def test_polling_or_a_second_waiter_gets_the_helper_or_the_first_waiters_result(monkeypatch):
    (sender, g0), (receiver, g1) = _pair(monkeypatch, "rss")
    send, recv, received, _ = _message(sender, g0, receiver, g1, 0, 7.0)
    on_recv = _completion_thread(recv)
    while not recv.done():  # a poll hands the op to the stream's helper
        pass
    # A future is done before its callbacks have run (on the thread that completed it): give the
    # helper's callback its moment.
    deadline = time.monotonic() + 10
    while not on_recv and time.monotonic() < deadline:
        time.sleep(0.001)
    assert on_recv and on_recv != [threading.get_ident()]
    assert received.eq(7.0).all()
    results = []
    waiters = [threading.Thread(target=lambda: results.append(send.wait())) for _ in range(2)]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join(30)
    assert results == [[], []], "both waiters return; gloo's work is waited once"
    _shutdown(sender, receiver)


def test_a_send_waited_late_completes_when_its_stream_moves_on(monkeypatch):
    """A pipeline waits for its sends a step late: the next send on the stream hands the earlier
    one to the helper, which completes it although the script has not waited yet."""
    (sender, g0), (receiver, g1) = _pair(monkeypatch, "rss")
    first, first_recv, _, _ = _message(sender, g0, receiver, g1, 0, 1.0)
    done = threading.Event()
    first.add_done_callback(lambda _f: done.set())
    first_recv.wait()
    assert not done.wait(0.5), "the first send waits for its waiter while its stream is idle"
    second, second_recv, received, _ = _message(sender, g0, receiver, g1, 1, 2.0)
    assert done.wait(30), "the stream's next send handed the first one to the helper"
    second_recv.wait()
    second.wait()
    first.wait()
    assert received.eq(2.0).all()
    _shutdown(sender, receiver)


def test_shutdown_completes_the_messages_nobody_waited_for(monkeypatch):
    (sender, g0), (receiver, g1) = _pair(monkeypatch, "rss")
    send, recv, received, _ = _message(sender, g0, receiver, g1, 0, 3.0)
    completed = [threading.Event(), threading.Event()]
    for future, event in zip((send, recv), completed):
        future.add_done_callback(lambda _f, e=event: e.set())
    _shutdown(sender, receiver)
    assert all(e.wait(30) for e in completed)
    assert received.eq(3.0).all()
