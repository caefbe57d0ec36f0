"""The memory cap (``memory_cap_bytes`` / ``--memory-cap``) and ``prism emulate --profile``, end to end
on CPU with the pp example as an 8-stage 1F1B pipeline (W=8, 64-row microbatches, so that stage
activations, not the model built at start-up, set each rank's peak).

With a cap between the highest tracked peak of the uncapped real run and the second highest, the
real run (``prism record --memory-cap``) stops with exactly the top rank out of memory, at a step
and an allocation that an emulation of that rank alone, with the same cap, reproduces; a rank
under the cap emulates to the end with the real run's peak, its steps timed in a second pass
without the tracker that enforced the cap. ``--profile`` leaves torch.profiler's
Chrome trace per sandbox rank, with the script's ops and prism's comm track."""

import json
from pathlib import Path

import pytest
import yaml

from prism.cli import EXIT_OOM
from prism.core.rundir import RunDir
from prism.sandbox.recording import record_job
from prism.vrank_replayer import capture_job
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.timeout(900)

ARGS = ["--steps", "2", "--pp", "8", "--microbatches", "8", "--microbatch-size", "64"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """(job file, uncapped run directory with its capture, tracked peak per rank)."""
    root = tmp_path_factory.mktemp("memcap")
    job_file = root / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": "pp8", "entrypoint": str(EXAMPLES / "pp/train.py"), "args": ARGS, "world_size": 8,
        "iterations": {"warmup": 1, "measured": 1}, "parallelism": {"pp": 8}}))
    run = root / "run"
    from prism.core.config import load_job

    graph = record_job(load_job(job_file), run, timeout_s=300)
    capture_job(RunDir(run).load_job(), run, timeout_s=300)
    peaks = {r: s.peak_memory_bytes for r, s in graph.summaries.items()}
    return job_file, run, peaks


def cap_between_top_two(peaks):
    (top, high), (_, second) = sorted(peaks.items(), key=lambda kv: -kv[1])[:2]
    assert high - second >= 4096, peaks  # a clear gap: one rank above the cap, every other one below
    return top, (high + second) // 2


def emulation_dir(run: Path, rank: int) -> Path:
    (out,) = sorted((run / "emulations").glob(f"*-ranks-{rank}"))[-1:]
    return out


def test_the_rank_above_the_cap_oom_in_the_real_run_and_in_its_emulation_at_the_same_step(pipeline, run_prism,
                                                                                          tmp_path):
    job_file, run, peaks = pipeline
    top, cap = cap_between_top_two(peaks)

    real = run_prism("record", "--job", str(job_file), "--out", str(tmp_path / "capped"), "--memory-cap", str(cap),
                     timeout=400)
    assert real.returncode == EXIT_OOM, real.stderr[-3000:]
    assert f"rank {top} ran out of memory at step" in real.stderr
    failure = json.loads((tmp_path / "capped" / "failure.json").read_text())
    assert failure["kind"] == "oom" and failure["rank"] == top
    (real_oom,) = failure["ooms"]  # exactly the rank above the cap
    assert real_oom["rank"] == top and real_oom["cap_bytes"] == cap and real_oom["device"] == "cpu"
    assert real_oom["in_use_bytes"] <= cap < real_oom["in_use_bytes"] + real_oom["requested_bytes"]
    assert "CPU out of memory (prism memory cap)" in failure["error"]
    assert not (tmp_path / "capped" / "graph" / "real").exists()  # a failed run leaves no graph

    emu = run_prism("emulate", str(run), "--ranks", str(top), "--memory-cap", str(cap), "--profile", "--json",
                    timeout=400)
    assert emu.returncode == EXIT_OOM, emu.stderr[-3000:]
    report = json.loads((emulation_dir(run, top) / "report.json").read_text())
    assert report["memory_cap_bytes"] == cap and report["failed"]["oom_ranks"] == [top]
    row = report["ranks"][str(top)]
    # the same step, the same allocation, the same bytes in use as the real run
    assert {k: row["oom"][k] for k in ("step", "requested_bytes", "in_use_bytes", "cap_bytes")} == \
        {k: real_oom[k] for k in ("step", "requested_bytes", "in_use_bytes", "cap_bytes")}
    assert f"rank {top}, step {real_oom['step']}" in row["oom"]["message"]
    assert len(row["step_ms"]) == real_oom["step"]  # the steps it finished before it ran out
    # the profile of the failed rank is kept too: it shows where it stopped
    assert (emulation_dir(run, top) / "profile" / f"rank{top}.json").is_file()
    # the OOM came from the tracked pass, which ran first; its outputs are the emulation's own
    assert not (emulation_dir(run, top) / "memory-pass").exists()
    assert (emulation_dir(run, top) / "logs").is_dir()


def test_a_rank_under_the_cap_emulates_to_the_end_with_the_real_peak_and_a_profile(pipeline, run_prism):
    _, run, peaks = pipeline
    top, cap = cap_between_top_two(peaks)
    rank = max((r for r in peaks if r != top), key=peaks.get)  # the closest one below the cap

    emu = run_prism("emulate", str(run), "--ranks", str(rank), "--memory-cap", str(cap), "--profile", "--json",
                    timeout=400)
    assert emu.returncode == 0, emu.stderr[-3000:]
    out = emulation_dir(run, rank)
    report = json.loads((out / "report.json").read_text())
    row = report["ranks"][str(rank)]
    assert row["oom"] is False and len(row["step_ms"]) == 2
    assert row["peak_memory_bytes"] == peaks[rank] < cap
    # the cap held in a tracked pass; the steps were timed in an untracked one, as the slices are
    assert (out / "memory-pass").is_dir()
    assert "sandbox_timed_with_tracker" not in report

    trace = json.loads((out / "profile" / f"rank{rank}.json").read_text())
    assert trace["distributedInfo"] == {"backend": "prism", "rank": rank, "world_size": 8}
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    names = {e["name"] for e in spans}
    assert {"aten::addmm", "aten::native_layer_norm", "aten::gelu"} <= names  # the script's ops
    comm = [e for e in spans if e.get("cat") == "prism_comm"]
    # prism's comm track: the stage's sends and receives, to and from its neighbour stages
    assert comm and {e["name"].split()[0] for e in comm} == {"send", "recv"}
    assert {int(e["name"].split()[-1]) for e in comm} <= {rank - 1, rank + 1}
    assert all(e["args"]["call_site"].startswith("train.py:") for e in comm)
    # on the profiler's clock (tied through the sync marker): inside the script's ops, but that the
    # last message may start after the last aten op (a stage's last send and its wait: 9.5 ms once)
    ops_ts = [e["ts"] for e in spans if e["name"].startswith("aten::")]
    step_us = max(row["step_ms"]) * 1e3
    assert min(ops_ts) <= min(e["ts"] for e in comm) and max(e["ts"] for e in comm) <= max(ops_ts) + step_us
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "prism_step"]
    assert [e["name"] for e in steps] == ["step 0 end", "step 1 end"]


def test_steps_past_the_recording_are_refused_before_any_rank_starts(pipeline, run_prism):
    _, run, _ = pipeline
    result = run_prism("emulate", str(run), "--ranks", "1", "--steps", "3", timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "steps: 3 is past the recording, which has 2 steps (the recorded job's --steps 2)" in result.stderr


@pytest.mark.parametrize("argv, message", [
    (["--args", '--steps "2'], "--args: '--steps \"2': No closing quotation; quote the arguments as a shell would"),
    (["--replayers", "0"], "argument --replayers: must be at least 1, got 0"),  # it used to wait for a replayer
])
def test_bad_emulate_arguments_are_named_before_any_rank_starts(pipeline, run_prism, argv, message):
    _, run, _ = pipeline
    result = run_prism("emulate", str(run), "--ranks", "1", *argv, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
