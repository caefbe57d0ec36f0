"""``prism replay``'s user errors: named, exit code 2, before any rank starts."""

from __future__ import annotations

import pytest

from ..conftest import EXAMPLES


@pytest.fixture
def run_without_graph(tmp_path):
    from prism.core.config import load_job
    from prism.core.rundir import RunDir

    RunDir(tmp_path / "run").save_job(load_job(EXAMPLES / "anomaly" / "job.yaml"))
    return tmp_path / "run"


def test_errors_name_the_problem(run_prism, run_without_graph):
    out = run_prism("replay", str(run_without_graph), "--rank", "5")
    assert out.returncode == 2 and "--rank 5 is outside the recorded job's ranks 0-1" in out.stderr
    out = run_prism("replay", str(run_without_graph), "--rank", "0", "--values")
    assert out.returncode == 2 and "graph/real: no graph to replay" in out.stderr and "--payloads" in out.stderr


def test_values_and_debug_need_what_they_use(run_without_graph):
    import importlib.util

    from prism.graph import parse_graph, write_graph
    from prism.sandbox.replaying import ReplayError, replay_rank

    from .test_engine import GRAPH

    write_graph(parse_graph(GRAPH), run_without_graph / "graph" / "real")
    with pytest.raises(ReplayError, match="prism record --payloads"):
        replay_rank(run_without_graph, 0, values=True)
    if importlib.util.find_spec("debugpy") is None:
        with pytest.raises(ReplayError, match="pip install debugpy"):
            replay_rank(run_without_graph, 0, debug_port=5678)
