"""The shim carries every bundled example unmodified, and one rank walked alone under the ``fake``
engine issues exactly the communication the real run recorded: op for op (kind, group members,
peer/root, shapes, dtype, reduce op, order), for every rank.

moe is left out: its all-to-all split sizes are decided by values other ranks send, which a
lone rank cannot know (that is what ``prism collect`` is for).
"""

import math

import pytest

from prism.core.config import load_job
from prism.graph.compare import compare_comm_sequences
from prism.graph.validate import validate
from prism.sandbox.launch import LaunchOptions, launch_ranks
from tests.conftest import EXAMPLES

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

VALUE_INDEPENDENT = ["ddp", "fsdp2", "tp", "pp", "pp-interleaved", "hybrid", "synthetic"]


@pytest.mark.parametrize("name", VALUE_INDEPENDENT)
def test_every_rank_alone_under_fake_matches_the_real_run(name, recorded_example):
    job, real = recorded_example(name)
    assert sorted(real.nodes) == list(range(job.world_size))
    assert validate(real) == [], "the real recording must be a consistent graph"
    walked = launch_ranks(job, LaunchOptions(engine="fake", max_parallel=2))
    for record in walked:
        groups = {g.group_id: g for g in record.groups}
        diff = compare_comm_sequences(record.rank, real.nodes[record.rank], real.groups, record.nodes, groups)
        assert diff is None, str(diff)
        assert sum(n.is_comm for n in record.nodes) > 0


# The bench's sleep variants (``--sleep-ms`` in a job file of their own) of the value-independent examples.
SLEEP_JOBS = {"ddp": "ddp/job-sleep.yaml", "fsdp2": "fsdp2/job-sleep.yaml", "tp": "tp/job-sleep.yaml",
              "pp": "pp/job-sleep.yaml", "pp-interleaved": "pp/job-interleaved-sleep.yaml",
              "hybrid": "hybrid/job-sleep.yaml"}


@pytest.mark.parametrize("name", SLEEP_JOBS)
def test_sleep_compute_leaves_the_examples_communication_as_it_is(name, recorded_example):
    """``--sleep-ms`` changes how long the compute takes, not one op of what the ranks exchange."""
    _, real = recorded_example(name)
    job = load_job(EXAMPLES / SLEEP_JOBS[name])
    assert "--sleep-ms" in job.args
    walked = launch_ranks(job, LaunchOptions(engine="fake", max_parallel=2, ranks=(2, 5)))
    assert [r.rank for r in walked] == [2, 5]
    for record in walked:
        groups = {g.group_id: g for g in record.groups}
        diff = compare_comm_sequences(record.rank, real.nodes[record.rank], real.groups, record.nodes, groups)
        assert diff is None, str(diff)


@pytest.mark.parametrize("name", ["ddp", "hybrid", "moe"])
def test_real_run_reports_losses_steps_and_memory_per_rank(name, recorded_example):
    job, real = recorded_example(name)
    steps = int(job.args[job.args.index("--steps") + 1])
    for rank, summary in real.summaries.items():
        assert len(summary.step_times_ns) == steps, rank
        assert all(t > 0 for t in summary.step_times_ns)
        assert summary.memory_source == "cpu.tracked_storage_peak"
        assert summary.peak_memory_bytes > 0
    # Every rank that computes a loss reports a finite one each step (pipeline ranks without the
    # last stage have none: NaN).
    finite = [s for s in real.summaries.values() if s.losses and all(math.isfinite(x) for x in s.losses)]
    assert finite, "no rank reported a loss"
    assert all(len(s.losses) == steps for s in finite)
