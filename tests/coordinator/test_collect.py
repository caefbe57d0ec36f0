"""Real collections: worker processes on K slots against a real (all-rank, gloo) recording."""

import dataclasses
import math
import time

import pytest
import torch

from prism.coordinator import CollectOptions, collect_job
from prism.coordinator.payloads import load_payload
from prism.core.config import ValuesPolicy, load_job
from prism.graph.compare import compare_comm_sequences
from prism.graph.io import read_graph
from prism.graph.records import CommOp, NodeKind
from prism.sandbox.recording import record_job
from tests.conftest import ASSETS, processes_tagged

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ops4(tmp_path_factory):
    """collect_ops4 (W=4): every op kind; recorded for real, then collected on 2 slots."""
    run = tmp_path_factory.mktemp("ops4")
    job = load_job(ASSETS / "jobs/collect_ops4/job.yaml")
    real = record_job(job, run, timeout_s=300)
    result = collect_job(job, run, CollectOptions(slots=2, timeout_s=300))
    return job, run, real, result


def test_comm_sequences_equal_the_real_run_op_for_op(ops4):
    job, run, real, result = ops4
    bare = read_graph(run / "graph/bare")
    assert bare.kind == "bare"
    for rank in range(job.world_size):
        assert compare_comm_sequences(rank, real.nodes[rank], real.groups, bare.nodes[rank], bare.groups) is None
        # every node kind in the same order: compute spans, comm, WAIT, MARK step_end
        assert [n.kind for n in bare.nodes[rank]] == [n.kind for n in real.nodes[rank]]
        assert [n.mark for n in bare.nodes[rank]] == [n.mark for n in real.nodes[rank]]


def test_losses_equal_the_real_run_within_fp32_rounding(ops4):
    job, _run, real, result = ops4
    for rank in range(job.world_size):
        got, want = result.graph.summaries[rank].losses, real.summaries[rank].losses
        assert len(got) == len(want) == 2
        for g, w in zip(got, want, strict=True):
            assert math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-6), (rank, got, want)


def test_uneven_all_to_all_splits_equal_the_real_run(ops4):
    job, _run, real, result = ops4
    for rank in range(job.world_size):
        def splits(g):
            return [(n.in_splits, n.out_splits) for n in g.nodes[rank]
                    if n.op is CommOp.ALL_TO_ALL and n.in_splits]
        assert splits(result.graph) == splits(real)
        assert splits(real)[0][0] == tuple(rank + d + 1 for d in range(4))


def test_at_most_k_ranks_ran_at_once_and_switches_are_counted(ops4):
    _job, _run, _real, result = ops4
    assert result.max_active == 2
    assert result.num_context_switches > 0
    assert result.swaps["num_swaps_out"] == result.swaps["num_swaps_in"] == result.num_context_switches


def test_small_payloads_are_recorded_and_hashed_in_the_graph(ops4):
    job, run, _real, result = ops4
    splits_nodes = [n for n in result.graph.nodes[1] if n.op is CommOp.ALL_TO_ALL and n.dtype == "i64"]
    assert splits_nodes and all(n.payload for n in splits_nodes)
    (received,) = load_payload(run / "payloads", splits_nodes[0].payload)
    assert received.tolist() == [s + 1 + 1 for s in range(4)]  # rank s sends s + d + 1 rows to d = 1
    recvs = [n for n in result.graph.nodes[2] if n.kind is NodeKind.RECV]
    assert recvs and all(n.payload for n in recvs)


def test_values_ranks_record_large_outputs_and_inputs_of_those_ranks_only(tmp_path):
    job = load_job(ASSETS / "jobs/allreduce2/job.yaml")
    job = dataclasses.replace(job, values=ValuesPolicy(small_max_bytes=8, ranks="1"))
    result = collect_job(job, tmp_path, CollectOptions(slots=1, timeout_s=300))
    grads = {r: [n for n in result.graph.nodes[r] if n.kind is NodeKind.COLLECTIVE and n.size_bytes == 16]
             for r in (0, 1)}
    assert grads[0] and not any(n.payload for n in grads[0])  # 16 B > 8 B and rank 0 not listed
    assert all(n.payload for n in grads[1])
    (value,) = load_payload(tmp_path / "payloads", grads[1][0].payload)
    assert torch.equal(value, torch.full((4,), 2.0 * 1 + 2.0 * 2))  # d(w*w)/dw = 2w, w = rank + 1
    import json

    index = json.loads((tmp_path / "payloads/index.json").read_text())
    assert any(k.startswith("1/") and "inputs" in v for k, v in index.items())
    assert not any(k.startswith("0/") and "inputs" in v for k, v in index.items())


def test_rank_that_skips_an_all_reduce_is_named_with_the_op(run_prism, tmp_path):
    result = run_prism("collect", "--job", str(ASSETS / "jobs/skip_rank3/job.yaml"), "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    err = " ".join(result.stderr.split())
    assert "collective mismatch" in err
    assert "rank 3 issued barrier" in err
    assert "issued all_reduce sum on group 0 seq 2" in err
    assert "train.py:18" in err
    assert processes_tagged(run_prism.tag) == []


def test_rank_that_stops_early_is_reported_as_a_deadlock(run_prism, tmp_path):
    result = run_prism("collect", "--job", str(ASSETS / "jobs/skip_rank3/job-deadlock.yaml"),
                       "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    err = " ".join(result.stderr.split())
    assert "deadlock" in err
    assert "rank 3 finished without issuing it" in err
    assert "all_reduce sum on group 0 seq 2" in err
    assert processes_tagged(run_prism.tag) == []


def test_rank_that_raises_stops_the_run_with_its_traceback_and_no_orphans(run_prism, tmp_path):
    started = time.monotonic()
    result = run_prism("collect", "--job", str(ASSETS / "jobs/raise_rank6/job.yaml"), "--out", str(tmp_path / "run"),
                       timeout=400)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert "rank 6 failed" in result.stderr
    assert "RuntimeError: boom in rank 6: sum was 8" in result.stderr
    assert 'train.py", line 11' in result.stderr
    assert processes_tagged(run_prism.tag) == []
    assert not (tmp_path / "run/graph/bare").exists()
    assert elapsed < 400


def test_recorded_comm_inputs_run_every_rank_alone_with_the_same_values(tmp_path):
    from prism.core.config import CommInputs

    job = load_job(ASSETS / "jobs/allreduce2/job.yaml")
    first = collect_job(dataclasses.replace(job, values=ValuesPolicy(ranks="0-1")), tmp_path / "a",
                        CollectOptions(slots=2, timeout_s=300))
    replay = dataclasses.replace(job, comm_inputs=CommInputs(source="recorded", run=str(tmp_path / "a")))
    second = collect_job(replay, tmp_path / "b", CollectOptions(slots=1, timeout_s=300))
    assert second.num_context_switches == 0  # nothing waits for a peer: ranks run one after the other
    assert second.max_active == 1
    for rank in range(2):
        g1, g2 = first.graph, second.graph
        assert compare_comm_sequences(rank, g1.nodes[rank], g1.groups, g2.nodes[rank], g2.groups) is None
        assert g2.summaries[rank].losses == g1.summaries[rank].losses
