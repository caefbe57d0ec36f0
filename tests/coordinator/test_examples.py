"""Every example at W=8 collected on K=2 slots equals the real gloo run: comm sequences op for op
(100 %, metadata ops included) and every rank's loss per step within fp32 rounding.

One collection per example shared by the checks (module scope; an example's tests run on one
pytest-xdist worker, ``xdist_group``); the real recordings are the session's (``recorded_example``).
"""

import logging
import math

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.graph.compare import compare_comm_sequences
from prism.graph.records import CommOp

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]

log = logging.getLogger(__name__)

NAMES = ["ddp", "fsdp2", "tp", "pp", "moe", "hybrid", "synthetic"]
LOSS_REL_TOL = 1e-5


EXAMPLES = [pytest.param(n, id=n, marks=pytest.mark.xdist_group(f"example-{n}")) for n in NAMES]


@pytest.fixture(scope="module")
def collected():
    return {}


@pytest.fixture
def example(request, tmp_path_factory, recorded_example, collected):
    """(name, job, the real run's graph, the collection): one collection per example and module,
    whichever test's parametrization asks first (a parametrized module fixture would be rebuilt when
    another test's parameters come between)."""
    name = request.param
    if name not in collected:
        job, real = recorded_example(name)  # the real gloo run, shared with other tests
        run = tmp_path_factory.mktemp(name)
        collected[name] = (name, job, real, collect_job(job, run, CollectOptions(slots=2, timeout_s=900)))
    return collected[name]


@pytest.mark.parametrize("example", EXAMPLES, indirect=True)
def test_comm_sequences_match_op_for_op(example):
    name, job, real, result = example
    assert job.world_size == 8 and result.num_slots == 2 and result.max_active <= 2
    for rank in range(job.world_size):
        diff = compare_comm_sequences(rank, real.nodes[rank], real.groups, result.graph.nodes[rank], result.graph.groups)
        assert diff is None, f"{name}: {diff}"
        assert [n.kind for n in result.graph.nodes[rank]] == [n.kind for n in real.nodes[rank]]


@pytest.mark.parametrize("example", EXAMPLES, indirect=True)
def test_losses_match_the_real_run_within_fp32_rounding(example):
    name, job, real, result = example
    worst = 0.0
    for rank in range(job.world_size):
        got, want = result.graph.summaries[rank].losses, real.summaries[rank].losses
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            if math.isnan(w):
                assert math.isnan(g)
                continue
            worst = max(worst, abs(g - w) / max(abs(w), 1e-12))
    print(f"{name}: max relative loss difference {worst:.3g}, {result.num_context_switches} context switches, "
          f"collect {result.wall_s:.1f} s")
    assert worst <= LOSS_REL_TOL


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.values == ("moe",)], indirect=True)
def test_moe_split_sizes_equal_the_real_run(example):
    name, job, real, result = example
    for rank in range(job.world_size):
        def splits(g):
            return [(n.in_splits, n.out_splits) for n in g.nodes[rank] if n.op is CommOp.ALL_TO_ALL and n.in_splits]
        assert splits(result.graph) and splits(result.graph) == splits(real)
        assert any(len(set(s[0])) > 1 for s in splits(real)), "the example should send uneven splits"
