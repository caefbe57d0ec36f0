"""Structure-and-timing replay of the synthetic pipeline (sleep compute): the replayed rank's
iteration time against the recorded one, with recorded durations and with 30 % of them withheld
and estimated. Stage 0 is 3x slower, so the replayed last stage spends most of its step waiting
for recvs: a replay that ignored the recorded completion times would be about 2x too fast.

The tolerances hold on a loaded 2-core host (the replay's sleeps wake late there like the real
run's did); bench/replay.py measures the figures (README, docs/replay.md)."""

from __future__ import annotations

import dataclasses

import pytest

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.sandbox.replaying import replay_rank

from ..conftest import EXAMPLES

pytestmark = pytest.mark.slow

ARGS = ("--steps", "5", "--dp", "1", "--pp", "2", "--microbatches", "4", "--fwd-ms", "4", "--bwd-ms", "8",
        "--slow-stage", "0", "--slow-factor", "3")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    job = load_job(EXAMPLES / "synthetic" / "job.yaml")
    job = dataclasses.replace(job, args=ARGS, world_size=2, ranks_per_node=2,
                              parallelism=dataclasses.replace(job.parallelism, dp=1, pp=2))
    run = tmp_path_factory.mktemp("synthetic") / "run"
    record_job(job, run, timeout_s=240)
    return run


@pytest.fixture(scope="module")
def replayed(run_dir):
    return replay_rank(run_dir, 1, timeout_s=240)


def test_recorded_durations_reproduce_the_iteration_time(replayed):
    assert len(replayed.step_times_ns) == 5
    assert abs(replayed.error) < 0.25, (replayed.recorded_mean_ns, replayed.replayed_mean_ns)


def test_untimed_replay_is_far_faster_and_steps_stops_it(run_dir, replayed):
    untimed = replay_rank(run_dir, 1, timing="none", steps=2, timeout_s=240)
    assert len(untimed.step_times_ns) == 2
    assert untimed.replayed_mean_ns < 0.7 * replayed.recorded_mean_ns, "the waits are most of the step"


def test_withheld_durations_are_estimated_close_to_the_recorded_time(run_dir, replayed):
    withheld = replay_rank(run_dir, 1, withhold=0.3, seed=1, timeout_s=240)
    assert abs(withheld.error) < 0.3, (withheld.recorded_mean_ns, withheld.replayed_mean_ns)
    # against the replay with every recorded duration, run under the same host load
    assert abs(withheld.replayed_mean_ns / replayed.replayed_mean_ns - 1) < 0.15
