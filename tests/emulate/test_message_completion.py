"""A message posted early and waited for after compute (tests/assets/jobs/late_wait2): ``prism
record`` stamps its completion at the script's wait, as a plain gloo run's wait completes it, but a
calibration slice stamps it when gloo finished it, so the timed graph holds the transfer and not
the compute before the wait (docs/timing.md, "Messages the script waits for"). The replayer plays
each message's vrank end as one send or receive and reports what it cost its thread."""

import dataclasses
import json
from pathlib import Path

import pytest

from prism.core.config import load_job
from prism.core.whatif import SandboxChange
from prism.graph.io import read_graph
from prism.graph.records import NodeKind
from prism.graph.simulate import estimate_transfers
from prism.nccl_patches.recorded_store import derive_from_capture
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions, capture_job, emulate
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.replayer import replayer_result_path

pytestmark = pytest.mark.timeout(600)

JOB = Path(__file__).resolve().parents[1] / "assets" / "jobs" / "late_wait2" / "job.yaml"
MEASURED_STEPS = (1, 2)


def early_message(graph, kind: NodeKind, rank: int):
    """The rank's first message of each measured step (the one waited for late)."""
    return [next(n for n in graph.nodes[rank] if n.step == s and n.kind is kind) for s in MEASURED_STEPS]


def test_a_slice_times_a_message_to_its_completion_not_to_the_late_wait(tmp_path):
    run = tmp_path / "run"
    record_job(load_job(str(JOB)), run)
    calibrate_run(run, slice_size=1, timeout_s=300)
    real, timed = read_graph(run / "graph" / "real"), read_graph(run / "graph" / "timed")

    # the real run: each side's duration runs to its wait (the sleeps before it only lengthen)
    assert all(n.duration_ns >= 30e6 for n in early_message(real, NodeKind.SEND, 0))
    assert all(n.duration_ns >= 60e6 for n in early_message(real, NodeKind.RECV, 1))
    # the slices time it to its completion (its peer a vrank that answers at once), so the timed
    # graph's transfer is gloo's and the send completes when rank 1 posts its receive, at 20 ms
    transfers = estimate_transfers(timed).message_ns
    sends = early_message(timed, NodeKind.SEND, 0)
    assert all(transfers[(0, 1, n.group_id, n.seq)] < 10e6 for n in sends), transfers
    assert all(n.duration_ns < 30e6 for n in sends), [n.duration_ns / 1e6 for n in sends]


@pytest.mark.parametrize(("steps", "numel", "eager", "memory"),
                         [(40, 256, False, "pass"), (4, 16384, False, "pass"), (4, 16384, True, "pass"),
                          (4, 256, False, "untracked")])
def test_every_send_whose_values_changed_is_flagged_diverged(tmp_path, steps, numel, eager, memory):
    # A small send's bytes are kept at its post and checked later in batches of 64 on a channel
    # thread (40 steps: one batch, the rest at the end); a large one (64 KiB) is checked by the
    # thread that completes it: the script's when its wait gets there first, the channel thread
    # under eager completion (a calibration slice's). Either way each message sent with other
    # values than the recorded ones is flagged, and none when nothing changed. A two-pass emulation
    # (memory="pass") flags them in its memory pass and its timed pass compares nothing; a one-pass
    # emulation flags them itself.
    job = load_job(str(JOB))
    job = dataclasses.replace(job, env={**job.env, "LATE_WAIT_STEPS": str(steps), "LATE_WAIT_NUMEL": str(numel)})
    run = tmp_path / "run"
    record_job(job, run)
    capture_job(job, run, derive_for=(0,), timeout_s=240)
    options = EmulateOptions(ranks=(0,), timeout_s=240, eager_completion=eager, memory=memory)
    assert emulate(run, options).ranks[0].diverged_ops == ()
    change = SandboxChange(env=(("LATE_WAIT_OFFSET", "1"),))
    result = emulate(run, dataclasses.replace(options, change=change))
    flagged = result.ranks[0].diverged_ops
    assert len(set(flagged)) == len(flagged) == 2 * steps, flagged  # every step's two sends
    assert all(op.startswith("send ") for op in flagged), flagged
    timed = json.loads((result.out_dir / "rank-00000.live.json").read_text())
    assert [f"{x['op']} {x['key']}" for x in timed["diverged_ops"]] == list(flagged)
    assert timed["flagged_divergence"] is (memory != "pass")
    if memory == "pass":
        tracked = json.loads((result.out_dir / "memory-pass" / "rank-00000.live.json").read_text())
        assert tracked["flagged_divergence"] is True and tracked["diverged_ops"] == timed["diverged_ops"]


def test_the_replayer_plays_each_message_once_and_reports_its_streams_cpu(tmp_path):
    # Each message between a vrank and a sandbox rank is one send or one receive that the replayer
    # posts directly (no pruned party): rank 0 sandbox, vrank 1 receives; rank 1 sandbox, vrank 0
    # sends (through its helpers). Either way the stream serves every message of the recording once,
    # counts its bytes, and reports its channel thread's CPU.
    job = load_job(str(JOB))
    run = tmp_path / "run"
    record_job(job, run)
    capture = capture_job(job, run, derive_for=(0,), timeout_s=240)
    derive_from_capture(run, capture, (1,))
    graph = read_graph(run / "graph" / "real")
    sends = [n for n in graph.nodes[0] if n.kind is NodeKind.SEND]
    assert len(sends) == 8  # 4 steps, an early and a blocking message each
    for sandbox in ((0,), (1,)):
        result = emulate(run, EmulateOptions(ranks=sandbox, timeout_s=240, memory="untracked"))
        assert result.ranks[sandbox[0]].diverged_ops == ()
        rep = json.loads(replayer_result_path(result.out_dir, 0).read_text())
        streams = [name for name in rep["channel_ops"] if "->" in name]
        assert len(streams) == 1 and streams[0].endswith(":0->1"), rep["channel_ops"]
        assert rep["channel_ops"][streams[0]] == len(sends)
        assert rep["channel_cpu_s"][streams[0]] > 0
        barrier_bytes = rep["traffic_bytes"] - sum(n.size_bytes for n in sends)
        assert 0 <= barrier_bytes < 64, (rep["traffic_bytes"], [n.size_bytes for n in sends])
