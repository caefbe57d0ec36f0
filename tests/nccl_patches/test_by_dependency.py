"""Over gloo a party runs by dependency, not step by step.

A vrank endpoint of a ring answers each message once the messages of its chunk are in: W=8 ring all-reduce, sandbox {0, 4}, one endpoint hosting every vrank, over a real gloo transport
(one process, a thread per endpoint). The vrank 3's messages to sandbox rank 4 at steps 0-2 carry
chunks that have not passed sandbox rank 0 yet, so rank 4 gets them while rank 0 has not started;
step by step, the endpoint would hold step 1 until rank 0's step-0 message came.

An endpoint whose receive buffers exceed its budget posts each receive as an earlier one completes.
"""

import datetime
import functools
import threading

import pytest
import torch
import torch.distributed as dist

from prism.nccl_patches import pruned
from prism.nccl_patches.compensation import record_for_sandbox
from prism.nccl_patches.pruned import neighbor_ranks, pruned_steps, run_neighbor_side, run_sandbox_side
from prism.nccl_patches.schedule import Algo
from prism.nccl_patches.transport import Transport
from tests.nccl_patches.cases import make_inputs

pytestmark = pytest.mark.timeout(120)

N, SANDBOX, FREE_STEPS = 8, (0, 4), 3


def _connect(store, endpoint_of):
    transports = {}
    endpoints = sorted(set(endpoint_of.values()))

    def join(e):
        transports[e] = Transport.connect(store, e, len(endpoints), endpoint_of, timeout_s=30)

    threads = [threading.Thread(target=join, args=(e,)) for e in endpoints]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(transports) == endpoints
    return transports


def _within(work, seconds):
    try:
        return bool(work.wait(datetime.timedelta(seconds=seconds)))
    except RuntimeError:  # gloo's wait raises on its timeout
        return False


def _run(errors, results, name, fn):
    try:
        results[name] = fn()
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_a_sandbox_rank_gets_the_vrank_messages_that_do_not_depend_on_a_late_sandbox_rank():
    x = make_inputs(N, 3 * N + 1, torch.float32, 1)
    rec = record_for_sandbox(x, Algo.RING_ALL_REDUCE, "sum", SANDBOX)
    endpoint_of = {0: 0, 4: 1, **{r: 2 for r in range(N) if r not in SANDBOX}}
    transports = _connect(dist.HashStore(), endpoint_of)
    errors, results = [], {}
    run = functools.partial(_run, errors, results)
    vranks = threading.Thread(target=run, daemon=True, args=("vranks", lambda: run_neighbor_side(
        transports[2], rec, neighbor_ranks(rec), timeout_s=30)))
    vranks.start()
    # rank 4 by hand: its messages in step order, rank 0 not started
    mine = sorted((st for st in pruned_steps(rec) if 4 in (st.src, st.dst)), key=lambda st: (st.t, st.src))
    ins = [st for st in mine if st.dst == 4]
    outs = [st for st in mine if st.src == 4]
    t4 = transports[1]
    sends = [t4.send(torch.zeros(st.numel), 4, st.dst, st.tag(N)) for st in outs[:FREE_STEPS]]
    early = [t4.recv(torch.empty(st.numel), st.src, 4, st.tag(N)) for st in ins[:FREE_STEPS]]
    got = [_within(w, 10) for w in early]
    assert got == [True] * FREE_STEPS, f"rank 4's messages of steps 0-{FREE_STEPS - 1} while rank 0 is late: {got}"

    rank0 = threading.Thread(target=run, daemon=True, args=("rank0", lambda: run_sandbox_side(
        transports[0], Algo.RING_ALL_REDUCE, 0, x[0].clone(), group_size=N, reduce_op="sum", recorded=rec,
        timeout_s=30)))
    rank0.start()
    for st_out, st_in in zip(outs[FREE_STEPS:], ins[FREE_STEPS:], strict=True):
        sends.append(t4.send(torch.zeros(st_out.numel), 4, st_out.dst, st_out.tag(N)))
        assert _within(t4.recv(torch.empty(st_in.numel), st_in.src, 4, st_in.tag(N)), 30), st_in
    for w in sends:
        assert _within(w, 30)
    rank0.join(60)
    vranks.join(60)
    assert not errors, errors
    # rank 0 ran its whole all-reduce against the endpoint (its values, with rank 4's zeros in them,
    # are tests/nccl_patches/test_multiprocess.py's concern)
    assert results["rank0"].output.shape == x[0].shape
    for t in transports.values():
        t.close()


@pytest.mark.parametrize("algo", [Algo.RING_ALL_REDUCE, Algo.DIRECT_ALL_TO_ALL])
def test_an_endpoint_whose_receives_exceed_the_budget_posts_them_as_earlier_ones_complete(monkeypatch, algo):
    n, numel = 4, 4 * 6
    monkeypatch.setattr(pruned, "_MAX_BYTES_POSTED_AHEAD", 4)  # less than one message: one receive at a time
    x = make_inputs(n, numel, torch.float32, 2)
    rec = record_for_sandbox(x, algo, "sum" if algo.reduces else "", [0])
    transports = _connect(dist.HashStore(), {0: 0, 1: 1, 2: 1, 3: 1})
    errors, results = [], {}
    vranks = threading.Thread(target=_run, daemon=True, args=(errors, results, "vranks", lambda: run_neighbor_side(
        transports[1], rec, neighbor_ranks(rec), timeout_s=30)))
    vranks.start()
    data = x[0].clone().reshape(n, -1) if algo is Algo.DIRECT_ALL_TO_ALL else x[0].clone()
    mine = run_sandbox_side(transports[0], algo, 0, data, group_size=n, reduce_op="sum" if algo.reduces else "",
                            recorded=rec, timeout_s=30)
    vranks.join(60)
    assert not errors, errors
    assert results["vranks"].num_steps == len(pruned_steps(rec))  # every message to and from rank 0
    assert torch.equal(mine.output, rec.outputs[0].reshape(-1)) and not mine.diverged
    for t in transports.values():
        t.close()
