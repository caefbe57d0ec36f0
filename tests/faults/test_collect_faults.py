"""collect under faults: interrupted, killed, out of disk. Each stops within 10 s, names the part
and the cause, leaves no process, and RUN holds no graph and no payloads of the failed run."""

import resource
import signal
import time

import pytest

from prism.core.atomic import remove_stale_temporaries

from .conftest import STOP_BOUND_S, write_job

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def nothing_of_the_run(run):
    assert not (run / "graph").exists(), "a failed collect must not leave a graph"
    assert not (run / "payloads").exists(), "a failed collect must not leave payloads"


def test_sigint_stops_collect_and_leaves_the_run_directory_as_it_was(tmp_path, cli):
    run = tmp_path / "run"
    c = cli("collect", "--job", str(write_job(tmp_path)), "--out", str(run))
    c.wait_for_log(str(run / "logs/rank-0000*.log"))
    t0 = time.monotonic()
    c.proc.send_signal(signal.SIGINT)
    assert c.seconds_to_exit(t0) < STOP_BOUND_S
    assert c.proc.returncode == 130
    assert "prism collect stopped by SIGINT" in c.stderr
    assert c.left_processes() == []
    nothing_of_the_run(run)
    assert [p.name for p in run.glob(".*")] == [], "the staging directory is removed"


def test_kill_9_of_the_coordinator_takes_every_worker_with_it_and_the_next_collect_cleans_up(tmp_path, cli):
    run = tmp_path / "run"
    c = cli("collect", "--job", str(write_job(tmp_path)), "--out", str(run))
    c.wait_for_log(str(run / "logs/rank-0000*.log"))
    t0 = time.monotonic()
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    assert c.left_processes() == []
    assert time.monotonic() - t0 < STOP_BOUND_S
    nothing_of_the_run(run)
    (stale,) = run.glob(".collect.*.tmp")  # the coordinator could not remove its staging directory
    assert (stale / "payloads").is_dir()
    assert remove_stale_temporaries(run) == [stale]  # what the next collect into RUN does first


def test_a_write_that_fails_stops_collect_naming_the_payload_file_and_the_cause(tmp_path, cli):
    # RLIMIT_FSIZE as the full disk (no root needed): a payload of 64 KiB cannot be written.
    def cap_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

    run = tmp_path / "run"
    c = cli("collect", "--job", str(write_job(tmp_path, numel=16384)), "--out", str(run), preexec=cap_file_size)
    t0 = time.monotonic()
    c.proc.wait(timeout=240)
    assert c.proc.returncode == 2, c.stderr
    assert "cannot write recorded data" in c.stderr and "File too large" in c.stderr
    assert ".safetensors" in c.stderr or "payloads/pruned" in c.stderr
    assert c.left_processes() == []
    assert time.monotonic() - t0 < 240
    nothing_of_the_run(run)
