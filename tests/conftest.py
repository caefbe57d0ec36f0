import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(__file__).resolve().parent / "assets"
EXAMPLES = ROOT / "examples"


@pytest.fixture
def run_prism(tmp_path):
    """Run the real ``prism`` CLI in a subprocess tagged so its descendants can be found later."""
    tag = uuid.uuid4().hex

    def run(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
        full_env = dict(os.environ, PRISM_TEST_TAG=tag, **(env or {}))
        return subprocess.run(
            [sys.executable, "-m", "prism.cli.main", *args],
            capture_output=True, text=True, timeout=timeout, env=full_env, cwd=tmp_path,
        )

    run.tag = tag
    return run


def processes_tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("PRISM_TEST_TAG") == tag:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found
