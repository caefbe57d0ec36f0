"""The ``recorded`` engine in one process: alignment, completion at submit + duration (compute
overlaps it), estimated durations for ops without a record, and restored values."""

from __future__ import annotations

import time

import pytest
import torch

from prism.graph import parse_graph, write_graph
from prism.graph.payloads import PayloadStore, op_key
from prism.graph.records import CommOp
from prism.sandbox.engines.base import CommRequest, GroupHandle
from prism.sandbox.engines.recorded import RecordedEngine, ReplayOptions, record_payload_dir

GRAPH = """\
graph world_size=2 kind=real job_name=t
group 0 ranks=0,1
r0#0 COLL all_reduce g0:0 1KiB f32[256] sum step=0 t=0+200000000
r0#1 RECV recv g0:0 <-1 1KiB f32[256] step=0 t=0+100000000
r1#0 COLL all_reduce g0:0 1KiB f32[256] sum step=0 t=0+200000000
r1#1 SEND send g0:0 ->0 1KiB f32[256] step=0 t=0+1000
"""
GROUP = GroupHandle(group_id="0", ranks=(0, 1), group_rank=0)


def _engine(tmp_path, **kw) -> RecordedEngine:
    write_graph(parse_graph(GRAPH), tmp_path / "graph" / "real")
    return RecordedEngine(ReplayOptions(run_dir=str(tmp_path), rank=0, ranks_per_node=2, **kw),
                          current_step=lambda: 0)


def _all_reduce(t: torch.Tensor) -> CommRequest:
    return CommRequest(op=CommOp.ALL_REDUCE, group=GROUP, inputs=[t], outputs=[t], reduce_op="sum", seq=0)


def test_completion_at_the_recorded_time_overlaps_compute(tmp_path):
    engine = _engine(tmp_path)
    try:
        t0 = time.perf_counter()
        fut = engine.submit(_all_reduce(torch.ones(256)))
        assert not fut.done(), "submission returns before the recorded completion"
        time.sleep(0.05)  # independent compute while the op is outstanding
        fut.wait()
        elapsed = time.perf_counter() - t0
        # 200 ms recorded, the 50 ms of compute hidden (the timer may wake by its own latency early)
        assert 0.19 <= elapsed < 0.2 + 0.15, elapsed
        assert engine.counts["recorded"] == 1
        # recv of another size: no record, so its duration is estimated from the recorded recv
        t1 = time.perf_counter()
        out = torch.empty(512)
        engine.submit(CommRequest(op=CommOp.RECV, group=GROUP, inputs=[], outputs=[out], peer=1, seq=0)).wait()
        assert engine.counts == {**engine.counts, "unmatched": 1, "estimated": 1}
        assert 0.09 <= time.perf_counter() - t1 < 0.25
        assert torch.equal(out, torch.ones(512)), "no values asked: the fake engine's filler"
    finally:
        engine.shutdown()


def test_values_are_restored_into_the_scripts_tensor(tmp_path):
    store = PayloadStore(record_payload_dir(tmp_path, 0))
    recorded = torch.arange(256, dtype=torch.float32)
    store.note(op_key(0, "0", 0, "COLLECTIVE"), "outputs", store.put([recorded]))
    store.write_index()
    engine = _engine(tmp_path, values=True, timing="none")
    try:
        mine = torch.zeros(256)
        assert engine.submit(_all_reduce(mine)).wait()[0] is mine
        assert torch.equal(mine, recorded)
    finally:
        engine.shutdown()


def test_a_failure_while_completing_an_op_reaches_the_script_and_later_ops_still_complete(tmp_path, monkeypatch):
    # Session 14's slip: a NameError inside the completion killed the timer thread, and every rank
    # waited until its timeout. The failure now goes to that op's future; the thread goes on.
    import prism.sandbox.engines.recorded as recorded

    real_complete_op = recorded.complete_op
    calls = []

    def failing_once(future, value, extra):
        calls.append(1)
        if len(calls) == 1:
            raise NameError("name 'something' is not defined")
        real_complete_op(future, value, extra)

    monkeypatch.setattr(recorded, "complete_op", failing_once)
    engine = _engine(tmp_path, timing="none")
    try:
        first = engine.submit(_all_reduce(torch.ones(256)))
        t0 = time.perf_counter()
        with pytest.raises(NameError, match="something"):
            first.wait()
        assert time.perf_counter() - t0 < 5, "the failure is reported at once, not at a timeout"
        t = torch.ones(256)
        assert engine.submit(_all_reduce(t)).wait()[0] is t, "the timer thread survived the failure"
    finally:
        engine.shutdown()
