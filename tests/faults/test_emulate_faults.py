"""emulate under faults: a replayer killed, the CLI interrupted. Each stops within 10 s, names the
part and the cause, and leaves no process (a sandbox rank killed with -9: tests/sandbox and
bench/faults.py)."""

import shutil
import signal
import time

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import load_job

from .conftest import STOP_BOUND_S, write_job

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A collected run of faults4 with the recorded data of sandbox ranks 0 and 1."""
    root = tmp_path_factory.mktemp("faults-emulate")
    collect_job(load_job(write_job(root)), root / "run", CollectOptions(timeout_s=240))
    return root / "run"


def start_emulation(cli, run, env=None):
    shutil.rmtree(run / "emulations", ignore_errors=True)  # the log we wait for is the new run's
    c = cli("emulate", str(run), "--ranks", "0,1", "--timeout", "120", env=env)
    c.wait_for_log(str(run / "emulations/*/logs/rank-00000.log"))
    return c


def test_kill_9_of_a_replayer_stops_the_emulation_naming_the_replayer(collected, cli):
    c = start_emulation(cli, collected)
    c.find("replayer-000.spec.json").kill()
    t0 = time.monotonic()
    assert c.seconds_to_exit(t0) < STOP_BOUND_S
    assert c.proc.returncode == 1
    assert "replayer 0 failed" in c.stderr
    assert "killed by signal 9 (SIGKILL)" in c.stderr
    assert c.left_processes() == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_emulation_and_every_process(collected, cli, sig):
    # SIGTERM stops it like SIGINT (exit 128 + signal: 130 for Ctrl-C), naming the signal.
    c = start_emulation(cli, collected)
    t0 = time.monotonic()
    c.proc.send_signal(sig)
    assert c.seconds_to_exit(t0) < STOP_BOUND_S
    assert c.proc.returncode == 128 + sig
    assert f"prism emulate stopped by {sig.name}" in c.stderr
    assert c.left_processes() == []


def test_a_rank_that_raises_is_blamed_not_the_replayer_that_lost_it(collected, cli):
    # FAULT_RAISE (tests/assets/jobs/faults4/train.py): rank 1 raises right after "step 2".
    c = start_emulation(cli, collected, env={"FAULT_RAISE": "1:3"})
    t0 = time.monotonic()
    assert c.seconds_to_exit(t0) < STOP_BOUND_S
    assert c.proc.returncode == 1
    assert "error: rank 1 failed" in c.stderr
    assert "RuntimeError: injected failure in rank 1 at step 3" in c.stderr
    assert c.left_processes() == []
