"""RankLens §V-E: one trace of the early-wait schedule, replayed with the script's wait deferred.

The real run waits for branch A's all-reduce before branch B's compute; the replay runs the same
script with ``--defer-wait`` against that trace: A's all-reduce completes at its recorded time
after submission while B's compute runs, so the step gets shorter by about min(B, all-reduce)."""

from __future__ import annotations

import dataclasses

import pytest

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.sandbox.replaying import replay_rank

from ..conftest import EXAMPLES

pytestmark = pytest.mark.slow

ARGS = ("--steps", "4", "--a-ms", "10", "--b-ms", "30", "--grad-bytes", str(8 << 20))


@pytest.fixture(scope="module")
def early_trace(tmp_path_factory):
    job = dataclasses.replace(load_job(EXAMPLES / "overlap" / "job.yaml"), args=ARGS)
    run = tmp_path_factory.mktemp("overlap") / "early"
    graph = record_job(job, run, timeout_s=240)
    return run, graph


@pytest.fixture(scope="module")
def early_replay(early_trace):
    return replay_rank(early_trace[0], 0, timeout_s=240)


def test_early_schedule_replays_its_own_trace(early_replay):
    # loose: on a saturated 2-core host the script's sleeps alone drift by tens of percent between
    # the recorded run and the replay (bench/replay.py measures the figures)
    assert abs(early_replay.error) < 0.4, (early_replay.recorded_mean_ns, early_replay.replayed_mean_ns)


def test_deferring_the_wait_is_replayed_from_the_early_trace(early_trace, early_replay):
    run, graph = early_trace
    deferred = replay_rank(run, 0, script_args=(*ARGS, "--defer-wait"), timeout_s=240)
    # the changed schedule has the same ops (only the wait moved): the recorded durations apply
    ar_ms = [n.duration_ns / 1e6 for n in graph.nodes[0] if n.is_comm and n.step >= 1]
    saved = min(30.0, sorted(ar_ms)[len(ar_ms) // 2])  # B overlaps at most the all-reduce
    assert deferred.replayed_mean_ns < early_replay.replayed_mean_ns - 0.5 * saved * 1e6, (
        early_replay.replayed_mean_ns / 1e6, deferred.replayed_mean_ns / 1e6, ar_ms)
