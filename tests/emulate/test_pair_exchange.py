"""A group of two with one sandbox rank and one vrank runs its all-reduce, all-gather and
reduce-scatter as one exchange posted at the issue (prism.nccl_patches.pair; docs/emulate.md, "A
pair with a vrank partner exchanges once"): the collected values bit for bit, and for a changed
sandbox input the value the collector would compute, flagged diverged, as the ring gives it."""

import json
from pathlib import Path

import pytest

from prism.core.config import load_job
from prism.core.whatif import SandboxChange
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions, capture_job, emulate

pytestmark = pytest.mark.timeout(600)

JOB = Path(__file__).resolve().parents[1] / "assets" / "jobs" / "pair2" / "job.yaml"
STEPS = 3
OPS_PER_STEP = 3  # all-reduce, all-gather, reduce-scatter


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    job = load_job(str(JOB))
    run = tmp_path_factory.mktemp("pair2") / "run"
    graph = record_job(job, run, timeout_s=120)
    capture_job(job, run, derive_for=(0,), timeout_s=240)
    return run, graph


def live_report(result, rank: int) -> dict:
    return json.loads((result.out_dir / f"rank-{rank:05d}.live.json").read_text())


@pytest.mark.parametrize("exchange", ["pair", "ring"])
def test_a_pair_with_a_vrank_keeps_the_collected_values_and_computes_a_changed_input(captured, monkeypatch, exchange):
    run, graph = captured
    if exchange == "ring":
        monkeypatch.setenv("PRISM_PAIR_EXCHANGE", "0")
    same = emulate(run, EmulateOptions(ranks=(0,), timeout_s=240, memory="inline"))
    assert same.ranks[0].losses == graph.summaries[0].losses  # 324, 364, 404: sums of exact integers
    assert same.ranks[0].diverged_ops == ()
    pairs = live_report(same, 0)["pair_exchanges"]
    assert pairs == (STEPS * OPS_PER_STEP if exchange == "pair" else 0)
    # rank 0's inputs +1: the all-reduce's and all-gather's 8 elements and the reduce-scatter's 4
    changed = emulate(run, EmulateOptions(ranks=(0,), timeout_s=240, memory="inline",
                                          change=SandboxChange(env=(("PAIR_OFFSET", "1"),))))
    assert changed.ranks[0].losses == tuple(x + 20 for x in graph.summaries[0].losses)
    flagged = changed.ranks[0].diverged_ops
    assert len(flagged) == STEPS * OPS_PER_STEP, flagged
    assert {op.split(" ")[0] for op in flagged} == {"all_reduce", "all_gather", "reduce_scatter"}, flagged
