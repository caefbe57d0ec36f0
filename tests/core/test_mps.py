"""prism.core.mps.private_mps around NVIDIA's control program. CI has no NVIDIA driver, so an
executable named nvidia-cuda-mps-control on PATH stands in for it: it logs its arguments and
standard input and exits with the code the test gives it. Checked: the server is started with
``-d`` and private pipe and log directories, children see them in the environment for the body
only, ``quit`` is sent at the end and the directories are removed; a missing program or a failed
start is a PrismError that names the program and keeps the environment unchanged."""

from __future__ import annotations

import os
import stat

import pytest

from prism.core.errors import PrismError
from prism.core.mps import MPS_CONTROL, private_mps

pytestmark = pytest.mark.timeout(60)


def _control(tmp_path, monkeypatch, exit_code: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / MPS_CONTROL
    script.write_text(f"""#!/bin/sh
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY stdin=$(cat -)" >> {log}
echo "cannot start the server" >&2
exit {exit_code}
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    return log


def test_the_body_runs_with_a_private_server_that_is_quit_and_removed_afterwards(tmp_path, monkeypatch):
    log = _control(tmp_path, monkeypatch)
    with private_mps() as env:
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == env["CUDA_MPS_PIPE_DIRECTORY"]
        assert os.path.isdir(env["CUDA_MPS_PIPE_DIRECTORY"]) and os.path.isdir(env["CUDA_MPS_LOG_DIRECTORY"])
        assert len(env["CUDA_MPS_PIPE_DIRECTORY"]) < 100  # the server's Unix socket path must fit
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and "CUDA_MPS_LOG_DIRECTORY" not in os.environ
    assert not os.path.exists(os.path.dirname(env["CUDA_MPS_PIPE_DIRECTORY"]))
    start, stop = log.read_text().splitlines()
    assert start.startswith("args=-d ") and f"pipe={env['CUDA_MPS_PIPE_DIRECTORY']}" in start
    assert stop.startswith("args= ") and stop.endswith("stdin=quit")
    assert f"pipe={env['CUDA_MPS_PIPE_DIRECTORY']}" in stop


def test_the_environment_is_restored_when_the_body_fails(tmp_path, monkeypatch):
    log = _control(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "/users/own")
    with pytest.raises(RuntimeError, match="a rank failed"), private_mps():
        raise RuntimeError("a rank failed")
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/users/own" and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert log.read_text().splitlines()[-1].endswith("stdin=quit")


def test_a_failed_start_names_the_program_and_its_message(tmp_path, monkeypatch):
    _control(tmp_path, monkeypatch, exit_code=1)
    with pytest.raises(PrismError, match=f"{MPS_CONTROL} -d failed \\(1\\): cannot start the server"), private_mps():
        pytest.fail("the body must not run")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_without_the_program_the_error_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrismError, match=f"{MPS_CONTROL} is not on PATH"), private_mps():
        pytest.fail("the body must not run")
