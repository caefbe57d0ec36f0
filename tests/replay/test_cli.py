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


def test_a_job_without_a_loss_replays_with_no_nan_in_the_table_or_the_json(tmp_path, run_prism):
    import json

    (tmp_path / "train.py").write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "for _ in range(3):\n    t = torch.ones(4); dist.all_reduce(t)\n")
    (tmp_path / "job.yaml").write_text("name: noloss\nentrypoint: train.py\nworld_size: 2\n"
                                       "iterations: {warmup: 1, measured: 2}\n")
    assert run_prism("record", "--job", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "run")).returncode == 0
    out = run_prism("replay", str(tmp_path / "run"), "--rank", "1", "--json", str(tmp_path / "replay.json"))
    assert out.returncode == 0, out.stderr
    assert "nan" not in out.stdout.lower()
    data = json.loads((tmp_path / "replay.json").read_text())
    assert data["losses"] and all(x is None for x in data["losses"])
