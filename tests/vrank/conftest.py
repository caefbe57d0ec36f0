import dataclasses

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import ValuesPolicy, load_job
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
