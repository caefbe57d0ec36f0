"""Fault injection with the real CLI: start a command of the faults4 job (4 ranks, "step N" after
each step), inject a fault mid-run, and measure how it stops (docs/faults.md)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import ASSETS, processes_tagged

JOB_DIR = ASSETS / "jobs/faults4"
STOP_BOUND_S = 10.0


def write_job(directory: Path, *, steps: int = 40, numel: int = 1024, values_ranks: str = "0-1") -> Path:
    data = {"name": "faults4", "entrypoint": str(JOB_DIR / "train.py"),
            "args": ["--steps", str(steps), "--numel", str(numel)], "world_size": 4, "slots": 2,
            "iterations": {"warmup": 1, "measured": 3}, "values": {"ranks": values_ranks}}
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Cli:
    """``prism ARGS`` in a subprocess whose processes carry a tag (``processes_tagged``)."""

    def __init__(self, cwd: Path, *args: str, preexec=None, env: dict | None = None) -> None:
        self.tag = uuid.uuid4().hex
        self.stderr_path = cwd / f"cli-{self.tag[:8]}.stderr"

        def setup() -> None:
            # As in a terminal's foreground, also when pytest runs in the background (a shell
            # starts background jobs with SIGINT ignored; Python then never raises KeyboardInterrupt).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if preexec:
                preexec()

        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "prism.cli.main", *args], cwd=cwd,
                                         env=dict(os.environ, PRISM_TEST_TAG=self.tag, COLUMNS="200", **(env or {})),
                                         stdout=subprocess.DEVNULL, stderr=err, preexec_fn=setup)

    @property
    def stderr(self) -> str:
        """The CLI's stderr with whitespace runs as one space (the console wraps long lines)."""
        return " ".join(self.stderr_path.read_text(errors="replace").split())

    def wait_for_log(self, pattern: str, text: str = "step 2", timeout_s: float = 240) -> None:
        """Until a file matching ``pattern`` (a glob) holds ``text``: the run is under way."""
        root, glob = Path(pattern).anchor, pattern[len(Path(pattern).anchor):]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in p.read_text(errors="replace") for p in Path(root).glob(glob)):
                return
            assert self.proc.poll() is None, f"the run ended before {text!r}:\n{self.stderr}"
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} in {pattern} within {timeout_s} s")

    def find(self, needle: str):
        for p in processes_tagged(self.tag):
            if needle in " ".join(p.cmdline()):
                return p
        raise AssertionError(f"no process of the run matches {needle!r}")

    def seconds_to_exit(self, since: float, timeout_s: float = 60) -> float:
        self.proc.wait(timeout=timeout_s)
        return time.monotonic() - since

    def left_processes(self) -> list:
        """Processes of the run still alive a moment after the CLI exited."""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and processes_tagged(self.tag):
            time.sleep(0.1)
        return [p for p in processes_tagged(self.tag) if p.status() != "zombie"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in processes_tagged(self.tag):
            p.kill()


@pytest.fixture
def cli(tmp_path):
    """``cli(*args, preexec=None, env=None) -> Cli``; every run is killed at the end of the test."""
    started = []

    def start(*args: str, preexec=None, env: dict | None = None) -> Cli:
        c = Cli(tmp_path, *args, preexec=preexec, env=env)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()
