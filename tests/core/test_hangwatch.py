"""The launcher's hang watcher over the op lines ranks publish (protocol in prism.core.hangwatch),
through a real c10d store."""

import time

import pytest
import torch.distributed as dist

from prism.core.errors import HangError, MismatchError
from prism.core.hangwatch import HangWatcher, queue_key

pytestmark = pytest.mark.timeout(60)

AR4 = "all_reduce sum f32 (4,)"


def op(token, key, members, fp, detail):
    return f"O\t{token}\t{key}\t{members}\t{fp}\t{time.perf_counter_ns()}\t{detail}"


def publish(store, rank, *lines):
    store.queue_push(queue_key(rank), "\n".join(lines))


@pytest.fixture
def store():
    return dist.HashStore()


def test_agreeing_ranks_pass_and_completed_instances_are_forgotten(store):
    watcher = HangWatcher(store, range(2), timeout_s=60)
    for r in range(2):
        publish(store, r, "G\t0\t0-1", op(0, "0:0", "g:0", AR4, "all_reduce seq 0"), "C\t0")
    watcher.poll()
    assert "not issued by every member" not in watcher.report()


def test_a_shape_disagreement_names_the_odd_rank_its_op_and_the_majority(store):
    watcher = HangWatcher(store, range(4), timeout_s=60)
    for r in range(4):
        shape = "(5,)" if r == 2 else "(4,)"
        publish(store, r, "G\t0\t0-3", op(7, "0:1", "g:0", f"all_reduce sum f32 {shape}",
                                          f"all_reduce sum on group 0 seq 1 f32 {shape} at train.py:9"))
    with pytest.raises(MismatchError) as e:
        watcher.poll()
    text = str(e.value)
    assert "collective mismatch at group 0 seq 1" in text
    assert "rank 2 issued all_reduce sum on group 0 seq 1 f32 (5,) at train.py:9" in text
    assert "while ranks 0-1,3 issued all_reduce sum on group 0 seq 1 f32 (4,) at train.py:9" in text
    assert "rank 0: waits in all_reduce sum on group 0 seq 1 f32 (4,)" in text


def test_a_send_and_its_recv_must_agree_on_the_message(store):
    watcher = HangWatcher(store, range(2), timeout_s=60)
    publish(store, 0, "G\t0\t0-1", op(0, "0:0>1:0", "p:0,1", "f32 (4,)", "send to rank 1 on group 0 seq 0 f32 (4,)"))
    publish(store, 1, "G\t0\t0-1", op(0, "0:0>1:0", "p:0,1", "f32 (8,)", "recv from rank 0 on group 0 seq 0 f32 (8,)"))
    with pytest.raises(MismatchError, match="group 0 message 0->1 seq 0"):
        watcher.poll()


def test_unwatched_members_are_not_waited_for(store):
    # emulate: only the sandbox ranks publish; the vranks of the group are not expected
    watcher = HangWatcher(store, [2, 5], timeout_s=60)
    publish(store, 2, "G\t0\t0-7", op(0, "0:0", "g:0", AR4, "all_reduce seq 0"), "F")
    publish(store, 5, "G\t0\t0-7", op(0, "0:0", "g:0", AR4, "all_reduce seq 0"))
    watcher.poll()


def test_a_rank_that_finished_without_an_op_its_peers_wait_in_is_a_deadlock(store):
    watcher = HangWatcher(store, range(3), timeout_s=60)
    for r in range(2):
        publish(store, r, "G\t0\t0-2", op(1, "0:1", "g:0", AR4, "all_reduce sum on group 0 seq 1 at train.py:18"))
    watcher.poll()
    publish(store, 2, "G\t0\t0-2", "F")
    with pytest.raises(MismatchError) as e:
        watcher.poll()
    assert "deadlock: rank 2 finished without issuing all_reduce sum on group 0 seq 1 at train.py:18, " \
           "which ranks 0-1 wait in" in str(e.value)


def test_a_stall_reports_every_rank_s_pending_op(store):
    watcher = HangWatcher(store, range(3), timeout_s=0.5)
    for r in range(2):
        publish(store, r, "G\t0\t0-2", op(1, "0:1", "g:0", AR4, "all_reduce sum on group 0 seq 1"))
    publish(store, 2, "G\t0\t0-2", op(0, "0:0", "g:0", AR4, "all_reduce sum on group 0 seq 0"), "C\t0")
    deadline = time.monotonic() + 30
    with pytest.raises(HangError) as e:
        while time.monotonic() < deadline:
            watcher.tick()
            time.sleep(0.05)
    text = str(e.value)
    assert text.startswith("no progress for 0.5 s (--timeout): no rank issued or completed a comm op; "
                           "ranks still running: 0-2")
    assert "rank 0: waits in all_reduce sum on group 0 seq 1 (issued" in text
    assert "rank 1: waits in all_reduce sum on group 0 seq 1 (issued" in text
    assert "rank 2: no comm op pending; its last op all_reduce sum on group 0 seq 0" in text
    assert "all_reduce sum on group 0 seq 1: ranks 0-1 issued it, 2 not yet" in text


def test_a_run_that_keeps_communicating_is_not_stopped_by_its_timeout(store):
    watcher = HangWatcher(store, range(1), timeout_s=0.5)
    publish(store, 0, "G\t0\t0")
    started = time.monotonic()
    token = 0
    while time.monotonic() - started < 2.0:
        publish(store, 0, op(token, f"0:{token}", "g:0", AR4, f"all_reduce seq {token}"), f"C\t{token}")
        token += 1
        watcher.tick()
        time.sleep(0.05)


def test_the_rank_whose_program_raised_first_is_named_when_a_peer_s_lost_connection_is_seen_first(store):
    import json

    from prism.core.errors import RankFailedError

    watcher = HangWatcher(store, range(3), timeout_s=60)
    boom = json.dumps("Traceback ...\nValueError: boom in rank 1")
    lost = json.dumps("Traceback ...\nRuntimeError: Connection closed by peer")
    publish(store, 1, f"X\t100\t{boom}")
    publish(store, 0, f"X\t200\t{lost}")
    peer = RankFailedError(0, "Traceback ...\nRuntimeError: Connection closed by peer", exit_code=1)
    explained = watcher.explain_failure(peer)
    assert isinstance(explained, RankFailedError) and explained.rank == 1
    assert "ValueError: boom in rank 1" in explained.traceback_text
    assert "(then rank 0 failed: RuntimeError: Connection closed by peer)" in explained.traceback_text
    own = RankFailedError(1, "Traceback ...\nValueError: boom in rank 1", exit_code=1)
    assert watcher.explain_failure(own) is own


def test_a_finished_rank_is_reported_finished_with_its_last_op_even_if_its_completion_was_not_seen(store):
    # The script's wait can return, and the rank exit, before the future's callbacks (which publish
    # the completion) have run on the backend's thread.
    watcher = HangWatcher(store, range(2), timeout_s=60)
    publish(store, 0, "G\t0\t0-1", op(1, "0:1", "g:0", AR4, "all_reduce sum on group 0 seq 1 at train.py:18"),
            op(2, "0:2", "g:0", AR4, "all_reduce sum on group 0 seq 2 at train.py:18"))
    publish(store, 1, "G\t0\t0-1", op(1, "0:1", "g:0", AR4, "all_reduce sum on group 0 seq 1 at train.py:18"), "F")
    with pytest.raises(MismatchError) as e:
        watcher.poll()
    text = str(e.value)
    assert "rank 1: finished; its last op all_reduce sum on group 0 seq 1 at train.py:18" in text
    assert "rank 0: waits in all_reduce sum on group 0 seq 1 at train.py:18" in text
