import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(__file__).resolve().parent / "assets"
EXAMPLES = ROOT / "examples"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """The tests of a module that share a module-scoped fixture (a recording, a collection) run on one
    pytest-xdist worker, so the fixture is made once rather than once per worker; a test that names
    its own ``xdist_group`` keeps it."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        if defs is None or item.get_closest_marker("xdist_group") is not None:
            continue
        if any(chain[-1].scope == "module" for chain in defs.name2fixturedefs.values() if chain):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


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


def peaks_a_real_run_reaches(emulated, first_real, rerun, more: int = 2) -> list:
    """The real runs' peaks seen until one equals ``emulated``: ``first_real``, then as many as
    ``more`` further real runs (``rerun(i)`` records one and returns its peaks). A tracked peak
    that an asynchronous op's input is alive for depends on when the peers arrive, so real runs of
    one program can disagree (``compare_peak`` in prism/vrank_replayer/fidelity.py); the emulated
    peak must be one that a real run reaches. ``emulated in`` the result is what a test asserts."""
    seen = [first_real]
    for i in range(more):
        if emulated in seen:
            break
        seen.append(rerun(i))
    return seen


EXAMPLE_JOBS = {
    "ddp": EXAMPLES / "ddp/job.yaml",
    "fsdp2": EXAMPLES / "fsdp2/job.yaml",
    "tp": EXAMPLES / "tp/job.yaml",
    "pp": EXAMPLES / "pp/job.yaml",
    "pp-interleaved": EXAMPLES / "pp/job-interleaved.yaml",
    "moe": EXAMPLES / "moe/job.yaml",
    "hybrid": EXAMPLES / "hybrid/job.yaml",
    "synthetic": EXAMPLES / "synthetic/job.yaml",
}


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A directory every pytest-xdist worker of this test session sees (the workers' base
    directories' parent), for a session fixture's product that one worker makes and the others
    read (under a ``FileLock``), instead of each worker making its own."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def recorded_example(tmp_path_factory):
    """``recorded_example(name) -> (job, graph)``: a real run of a bundled example (all ranks,
    gloo), recorded once per test session and shared by every test that needs it, on every
    pytest-xdist worker (the first worker to need it records it, the others read it).

    One tracked run instead of ``prism record``'s two passes: no test times these recordings, and
    the separate memory pass (tested in tests/sandbox/test_record_passes.py) would double each one."""
    from prism.core.config import load_job
    from prism.graph.io import read_graph
    from prism.sandbox.recording import record_job

    cache: dict = {}
    root = shared_dir(tmp_path_factory, "recorded")

    def get(name: str):
        if name not in cache:
            job, run = load_job(EXAMPLE_JOBS[name]), root / name
            with FileLock(root / f"{name}.lock"):  # another worker may be recording it
                done = run / "recorded.done"
                if done.exists():
                    graph = read_graph(run / "graph" / "real")
                else:
                    graph = record_job(job, run, memory_pass=False, replace=True)
                    done.touch()
            cache[name] = (job, graph, run)
        return cache[name][:2]

    get.run_dir = lambda name: (get(name), cache[name][2])[1]
    return get
