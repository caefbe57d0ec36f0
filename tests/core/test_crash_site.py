"""``crash_site`` on real tracebacks of a failing script: the exception line without c10's enforce
prefix, the torch.distributed call it came through, and the script's own line."""

import subprocess
import sys
import textwrap

import pytest

from prism.core.errors import crash_site

pytestmark = pytest.mark.timeout(120)


def _traceback_of(tmp_path, body: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_names_the_c10d_call_and_the_scripts_line(tmp_path):
    tb = _traceback_of(tmp_path, """\
        import torch
        import torch.distributed as dist


        def step():
            dist.all_reduce(torch.zeros(1))


        step()
        """)
    crash = crash_site(tb)
    assert crash.call == "all_reduce", tb  # not the helper inside c10d that raised
    assert crash.site == "train.py:6", tb
    assert crash.error.startswith("ValueError: Default process group has not been initialized"), crash


def test_drops_the_enforce_prefix_and_keeps_the_message(tmp_path):
    tb = _traceback_of(tmp_path, """\
        import torch

        torch.empty(2**60, dtype=torch.uint8)
        """)
    assert "[enforce fail at" in tb
    crash = crash_site(tb)
    assert crash.error.startswith("RuntimeError: DefaultCPUAllocator: can't allocate memory"), crash
    assert "1152921504606846976 bytes" in crash.error
    assert crash.call == "" and crash.site == "train.py:3", crash


def test_text_without_a_traceback():
    assert crash_site("") == crash_site("   \n")
    assert crash_site("rank 3 exited with code 9").error == "rank 3 exited with code 9"
