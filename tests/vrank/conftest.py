import dataclasses
import shutil

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import ValuesPolicy, load_job
from prism.core.rundir import RunDir
from prism.vrank_replayer import capture_job
from tests.conftest import EXAMPLE_JOBS


@pytest.fixture(scope="session")
def collected_with_values(tmp_path_factory):
    """``collected_with_values(name, sandbox) -> (run, graph)``: a bundled example collected on 2
    slots with ``values.ranks`` = ``sandbox``, once per session for every test that emulates those
    ranks of it (each emulation writes a folder of its own under RUN/emulations/)."""
    cache: dict = {}

    def get(name: str, sandbox: tuple[int, ...]):
        key = (name, tuple(sandbox))
        if key not in cache:
            job = load_job(EXAMPLE_JOBS[name])
            job = dataclasses.replace(job, values=ValuesPolicy(ranks=",".join(map(str, sandbox))))
            run = tmp_path_factory.mktemp(f"{name}-values") / "run"
            cache[key] = (run, collect_job(job, run, CollectOptions(slots=2, timeout_s=600)).graph)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def captured_example(recorded_example, tmp_path_factory):
    """``captured_example(name, sandbox) -> (run, graph, capture)``: a run directory with the real
    graph of a bundled example and the recorded data of ``sandbox``, derived from a capture run (all
    ranks live, prism's ring order: the values a collection produces), once per session."""
    cache: dict = {}

    def get(name: str, sandbox: tuple[int, ...]):
        key = (name, tuple(sandbox))
        if key not in cache:
            _, graph = recorded_example(name)
            src = recorded_example.run_dir(name)
            run = tmp_path_factory.mktemp(f"{name}-captured")
            shutil.copy(src / "job.yaml", run / "job.yaml")
            shutil.copytree(src / "graph", run / "graph")
            capture = capture_job(RunDir(run).load_job(), run, derive_for=tuple(sandbox), timeout_s=600)
            cache[key] = (run, graph, capture)
        return cache[key]

    return get
