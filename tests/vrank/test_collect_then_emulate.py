"""The user's path: ``prism collect`` with ``values.ranks: 2,5`` stores what the pruned
collectives need; ``prism emulate --ranks 2,5`` then runs ranks 2 and 5 for real, every other rank
virtual, and their losses equal the collected run's bitwise. pp (two virtual pipeline neighbours
of one sandbox rank) and moe (value-dependent all-to-all splits) go the same way."""

import dataclasses
import json
import math

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import ValuesPolicy, load_job
from prism.vrank_replayer import EmulateOptions, emulate
from tests.conftest import EXAMPLE_JOBS

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

# These tests compare values: one tracked emulation, not a timed one plus a memory pass (which
# tests/emulate/test_validate_cli.py and test_isolation.py run).
ONE_PASS = "inline"

# pp (4 stages x dp 2): rank 2 is a middle stage with two virtual pipeline neighbours, rank 7 the
# last stage (the only one with a loss). hybrid: rank 5 is on the last stage.
SANDBOXES = {"hybrid": (2, 5), "pp": (2, 7), "moe": (2, 5)}


@pytest.mark.parametrize("name", sorted(SANDBOXES))
def test_emulated_ranks_equal_the_collected_run_bitwise(name, collected_with_values):
    sandbox = SANDBOXES[name]
    run, collected = collected_with_values(name, sandbox)  # hybrid's is test_lanes_path's too
    result = emulate(run, EmulateOptions(ranks=sandbox, timeout_s=300, memory=ONE_PASS))
    for r in sandbox:
        got, want = result.ranks[r], collected.summaries[r].losses
        assert got.num_ops == len(collected.comm_nodes(r))
        assert got.diverged_ops == ()
        assert len(got.losses) == len(want)
        assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got.losses, want, strict=True)), \
            (name, r, got.losses, want)
    assert any(not math.isnan(x) for r in sandbox for x in result.ranks[r].losses), "no sandbox rank has a loss"
    if name == "hybrid":  # its TP pairs and 2-rank FSDP groups each hold one vrank: one exchange per op
        assert all(json.loads((result.out_dir / f"rank-{r:05d}.live.json").read_text())["pair_exchanges"] > 0
                   for r in sandbox)


def test_a_subset_of_the_collected_values_ranks_emulates_bitwise_from_derived_data(tmp_path):
    # values.ranks 1-3,6,7 (blocks 1-3 and 6-7 on pp's groups); emulate 2,7: the data of {2,7} is
    # derived from the larger set's records (RecordedCollective.restrict), not collected again.
    job = load_job(EXAMPLE_JOBS["pp"])
    job = dataclasses.replace(job, values=ValuesPolicy(ranks="1-3,6,7"))
    collected = collect_job(job, tmp_path / "run", CollectOptions(slots=2, timeout_s=600)).graph
    pruned = tmp_path / "run" / "payloads" / "pruned"
    assert not (pruned / "ranks-2_7").exists()
    result = emulate(tmp_path / "run", EmulateOptions(ranks=(2, 7), timeout_s=300, memory=ONE_PASS))
    assert (pruned / "ranks-2_7" / "index.json").is_file()
    for r in (2, 7):
        got, want = result.ranks[r], collected.summaries[r].losses
        assert got.diverged_ops == ()
        assert got.num_ops == len(collected.comm_nodes(r))
        assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got.losses, want, strict=True)), \
            (r, got.losses, want)
    assert not math.isnan(result.ranks[7].losses[0])


def test_nccl_algo_tree_runs_all_reduces_as_the_pruned_tree_with_the_collected_values(tmp_path):
    # The job asks NCCL for tree all-reduces: the collector records tree data (subtree partials)
    # and the sandbox ranks run the pruned tree; the values are still the collected ones, bitwise.
    job = load_job(EXAMPLE_JOBS["ddp"])
    job = dataclasses.replace(job, values=ValuesPolicy(ranks="2,5"), env={**job.env, "NCCL_ALGO": "Tree"})
    collected = collect_job(job, tmp_path / "run", CollectOptions(slots=2, timeout_s=600)).graph
    index = json.loads((tmp_path / "run/payloads/pruned/ranks-2_5/index.json").read_text())
    algos = {v["algo"] for k, v in index.items() if k.startswith("c/")}
    assert "tree_all_reduce" in algos and "ring_all_reduce" not in algos, algos
    result = emulate(tmp_path / "run", EmulateOptions(ranks=(2, 5), timeout_s=300, memory=ONE_PASS))
    for r in (2, 5):
        got, want = result.ranks[r], collected.summaries[r].losses
        assert got.diverged_ops == ()
        assert got.losses == want, (r, got.losses, want)


def test_collectives_begun_on_the_scripts_thread_keep_the_collected_values(collected_with_values, monkeypatch):
    # PRISM_LIVE_EARLY_START=1: a small collective's first ring step leaves from the script's thread
    # at its issue; the channel thread drives the rest of the ring (docs/emulate.md, session 43).
    # Hybrid's small collectives are all in pairs with a vrank, which exchange once instead of
    # running the ring: PRISM_PAIR_EXCHANGE=0 keeps them on it, as before.
    sandbox = SANDBOXES["hybrid"]
    run, collected = collected_with_values("hybrid", sandbox)
    monkeypatch.setenv("PRISM_LIVE_EARLY_START", "1")
    monkeypatch.setenv("PRISM_PAIR_EXCHANGE", "0")
    result = emulate(run, EmulateOptions(ranks=sandbox, timeout_s=300, memory=ONE_PASS))
    for r in sandbox:
        got = result.ranks[r]
        assert got.diverged_ops == ()
        want = collected.summaries[r].losses
        assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got.losses, want, strict=True))
        live = json.loads((result.out_dir / f"rank-{r:05d}.live.json").read_text())
        assert 0 < live["early_starts"] < live["num_ops"]  # some begun early, the large ones not
