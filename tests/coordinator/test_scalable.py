"""Scalable collection (paper §5.2): comm inputs from rules, and DP templates (one replica runs).

* With ``comm_inputs.source: rules`` the examples whose communication structure does not depend
  on values collect at W=8 with the real run's comm sequences op for op, and almost no context
  switch (only the small integer ops the built-in control-flow rule keeps exact).
* With ``templates: dp`` the hybrid example (pp=2 x dp=4 x tp=2, W=16) runs 4 ranks; the manifest
  maps all 16, and the expanded graph equals a full collection's structure.
"""

import dataclasses
import os
import time

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import CommInputs, Parallelism, load_job
from prism.graph.compare import compare_comm_sequences
from prism.graph.io import read_graph
from prism.graph.validate import validate
from tests.conftest import EXAMPLE_JOBS

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]

# Every value-independent example takes ~6 min on CI's 2 cores; pp and hybrid cover FSDP2, TP,
# PP and DP. PRISM_ALL_EXAMPLES=1 runs them all (docs/collect.md has the figures of a full run).
VALUE_INDEPENDENT = (["ddp", "fsdp2", "tp", "pp", "hybrid", "synthetic"] if os.environ.get("PRISM_ALL_EXAMPLES")
                     else ["pp", "hybrid"])


def _same_structure(expected, actual, world_size):
    for rank in range(world_size):
        diff = compare_comm_sequences(rank, expected.nodes[rank], expected.groups, actual.nodes[rank], actual.groups)
        assert diff is None, str(diff)
        assert [n.kind for n in actual.nodes[rank]] == [n.kind for n in expected.nodes[rank]], rank
        assert [n.mark for n in actual.nodes[rank]] == [n.mark for n in expected.nodes[rank]], rank


@pytest.mark.parametrize("name", VALUE_INDEPENDENT)
def test_rules_collection_has_the_real_runs_structure(name, recorded_example, tmp_path):
    job, real = recorded_example(name)
    job = dataclasses.replace(job, comm_inputs=CommInputs(source="rules"))
    result = collect_job(job, tmp_path, CollectOptions(slots=2, timeout_s=900))
    _same_structure(real, result.graph, job.world_size)
    assert validate(result.graph) == []
    assert result.num_by_rule > 0
    print(f"{name}: rules collection {result.wall_s:.1f} s, {result.num_context_switches} context switches, "
          f"{result.num_by_rule} ops by rule")


def _hybrid16(templates: str):
    job = load_job(EXAMPLE_JOBS["hybrid"])
    return dataclasses.replace(job, world_size=16, args=("--steps", "2", "--pp", "2", "--dp", "4", "--tp", "2"),
                               parallelism=Parallelism(dp=4, tp=2, pp=2), templates=templates)


def test_dp_templates_run_one_replica_and_expand_to_a_full_collections_structure(tmp_path):
    started = time.monotonic()
    templated = collect_job(_hybrid16("dp"), tmp_path / "templated", CollectOptions(slots=2, timeout_s=900))
    templated_s = time.monotonic() - started
    full = collect_job(_hybrid16("none"), tmp_path / "full", CollectOptions(slots=2, timeout_s=900))
    print(f"hybrid W=16: templated {templated_s:.1f} s ({templated.num_ranks_run} ranks ran), "
          f"full {full.wall_s:.1f} s")

    assert templated.num_ranks_run == 4 and full.num_ranks_run == 16
    stored = read_graph(tmp_path / "templated/graph/bare", expand=False)
    assert sorted(stored.nodes) == [0, 1, 8, 9]                       # dp coordinate 0 of the (pp, dp, tp) mesh
    assert stored.templates.template_of[15] == 9 and stored.templates.replica_of[15] == 3
    assert sorted(p.name for p in (tmp_path / "templated/graph/bare").glob("rank-*.pb")) == [
        "rank-00000.pb", "rank-00001.pb", "rank-00008.pb", "rank-00009.pb"]

    expanded = read_graph(tmp_path / "templated/graph/bare")          # what every reader sees
    assert sorted(expanded.nodes) == list(range(16))
    _same_structure(full.graph, expanded, 16)
    assert validate(expanded) == []
    # group ids are the ones c10d gave each replica, as in the full collection
    for rank in range(16):
        got = [n.group_id for n in expanded.nodes[rank] if n.is_comm]
        want = [n.group_id for n in full.graph.nodes[rank] if n.is_comm]
        assert got == want, rank
