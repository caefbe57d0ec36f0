"""Bad input and failing ranks: one clear message each, and no process left behind."""

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ASSETS, processes_tagged

pytestmark = pytest.mark.timeout(180)


def write_job(tmp_path, text: str, script: str | None = "import torch\n"):
    if script is not None:
        (tmp_path / "train.py").write_text(script)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_unknown_key_is_named_with_its_dotted_path(tmp_path, run_prism):
    job = write_job(tmp_path, "name: x\nentrypoint: train.py\nworld_size: 2\niterations: {warmup: 1, measurd: 2}\n")
    result = run_prism("record", "--job", job, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "iterations.measurd: unknown key" in result.stderr


def test_wrong_type_is_named(tmp_path, run_prism):
    job = write_job(tmp_path, "name: x\nentrypoint: train.py\nworld_size: eight\n")
    result = run_prism("record", "--job", job, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "world_size: expected an integer, got 'eight'" in result.stderr


def test_parallelism_that_disagrees_with_world_size(tmp_path, run_prism):
    job = write_job(tmp_path, "name: x\nentrypoint: train.py\nworld_size: 8\nparallelism: {dp: 2, tp: 2}\n")
    result = run_prism("record", "--job", job, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "parallelism: dp*tp*pp*cp = 2*2*1*1 = 4 but world_size is 8" in result.stderr


def test_missing_entrypoint_is_named(tmp_path, run_prism):
    job = write_job(tmp_path, "name: x\nentrypoint: nothere.py\nworld_size: 2\n", script=None)
    result = run_prism("record", "--job", job, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "entrypoint: script not found" in result.stderr
    assert "nothere.py" in result.stderr


def test_rank_that_raises_stops_the_run_with_its_traceback_and_no_orphans(tmp_path, run_prism):
    started = time.monotonic()
    result = run_prism("record", "--job", str(ASSETS / "jobs/raise_rank5/job.yaml"), "--out", str(tmp_path / "run"))
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert "rank 5 failed" in result.stderr
    assert "ValueError: boom in rank 5: sum was 8" in result.stderr
    assert 'train.py", line 13' in result.stderr  # the script's own frame
    assert elapsed < 120
    assert processes_tagged(run_prism.tag) == []
    assert not (tmp_path / "run" / "graph" / "real").exists(), "a failed run must not leave a graph"


def test_killing_the_launcher_takes_every_worker_with_it(tmp_path):
    import os
    import uuid

    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "prism.cli.main", "record", "--job", str(ASSETS / "jobs/raise_rank5/job.yaml"),
         "--out", str(tmp_path / "run")],
        env=dict(os.environ, PRISM_TEST_TAG=tag), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(processes_tagged(tag)) < 3:
        time.sleep(0.2)
    assert len(processes_tagged(tag)) >= 3, "workers never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and processes_tagged(tag):
        time.sleep(0.2)
    assert processes_tagged(tag) == []


@pytest.mark.parametrize("argv, message", [
    (["collect", "--job", "JOB", "--slots", "0", "--out", "run"], "argument --slots: must be at least 1, got 0"),
    (["calibrate", "run", "--slice-size", "0"], "argument --slice-size: must be at least 1, got 0"),
    (["walk", "--job", "JOB", "--rank", "7"], "error: rank 7 is outside 0-1"),
    (["export", "run", "--out", "no/such/folder/trace.json"], "--out: "),
    (["record", "--job", "JOB", "--out", "run", "--timeout", "-5"], "argument --timeout: must be above 0, got -5"),
    (["replay", "run", "--rank", "0", "--steps", "-1"], "argument --steps: must be at least 0, got -1"),
    (["analyze", "run", "--skip", "-1"], "argument --skip: must be at least 0, got -1"),
])
def test_out_of_range_counts_ranks_and_paths_are_one_line_errors(tmp_path, run_prism, argv, message):
    job = write_job(tmp_path, "name: x\nentrypoint: train.py\nworld_size: 2\n")
    result = run_prism(*[job if a == "JOB" else a for a in argv], timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    if argv[0] == "export":
        assert f"{tmp_path / 'no/such/folder'} is not a directory" in result.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a host without CUDA")
@pytest.mark.parametrize("command", ["record", "collect", "walk"])
def test_a_cuda_job_on_a_host_without_cuda_is_a_one_line_error(tmp_path, run_prism, command):
    job = write_job(tmp_path, "name: x\nentrypoint: train.py\nworld_size: 2\ndevice: cuda\n")
    argv = ["walk", "--job", job, "--rank", "0"] if command == "walk" else [command, "--job", job, "--out", "run"]
    result = run_prism(*argv, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert ("this host has no CUDA driver" if command == "collect" else
            "the job says device: cuda but this host has no CUDA device") in result.stderr
