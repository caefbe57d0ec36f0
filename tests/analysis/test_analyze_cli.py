"""Acceptance of ``prism analyze`` and ``prism export`` on real runs (gloo, sleep compute, so the
timing does not depend on how loaded the host is): a job with one slow DP replica is named
cross-rank skew (R3), a pipeline is named a structural orphan (H1, the bubble), with T_lb and the
binding chain printed, analysis.json and a Gantt chart per step written; the run's Chrome trace
nests per lane and its Chakra files read back."""

import dataclasses
import io
import json

import pytest
from rich.console import Console

from prism.cli.analyze import analyze_target, print_analysis
from prism.core.config import load_job
from prism.core.errors import RunDirError
from prism.graph.chakra import read_chakra
from prism.sandbox.recording import record_job
from tests.conftest import EXAMPLE_JOBS
from tests.graph.test_export import check_nesting

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def synthetic(tmp_path_factory, name, *, dp, pp, fwd_ms=5, extra=()):
    job = load_job(EXAMPLE_JOBS["synthetic"])
    job = dataclasses.replace(
        job, name=name, world_size=dp * pp, ranks_per_node=dp * pp,
        iterations=dataclasses.replace(job.iterations, warmup=1, measured=2),
        parallelism=dataclasses.replace(job.parallelism, dp=dp, pp=pp),
        args=("--steps", "3", "--dp", str(dp), "--pp", str(pp), "--microbatches", "4",
              "--fwd-ms", str(fwd_ms), "--bwd-ms", str(2 * fwd_ms), *extra))
    run = tmp_path_factory.mktemp(name)
    record_job(job, run)
    return run


@pytest.fixture(scope="module")
def slow_replica(tmp_path_factory):
    # microbatches of 60 ms on the slow replica: the skew stays well above what a loaded host's
    # scheduling adds to each sleep and message (at 5 ms a CI run under load named a step H2, or
    # put more than 0.75 of the work in R3)
    return synthetic(tmp_path_factory, "slowrep", dp=2, pp=1, fwd_ms=20,
                     extra=("--slow-replica", "1", "--slow-replica-factor", "1.6"))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    # microbatches of 30 ms: the bubble stays larger than what a loaded host's scheduling
    # latency adds to every message (R1)
    return synthetic(tmp_path_factory, "pipe", dp=1, pp=4, fwd_ms=10)


def verdict_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("verdict:"))


def test_one_slow_replica_is_named_cross_rank_skew(slow_replica, run_prism):
    res = run_prism("analyze", str(slow_replica))
    assert res.returncode == 0, res.stderr
    assert "R3 cross-rank skew, recoverable" in verdict_line(res.stdout)
    assert "T_lb" in verdict_line(res.stdout)
    chains = [line for line in res.stdout.splitlines() if line.startswith("binding chain, step")]
    assert len(chains) == 2 and all("compute" in c and "all_reduce" in c for c in chains)
    data = json.loads((slow_replica / "analysis" / "analysis.json").read_text())
    assert data["verdict"] == "R3" and [s["step"] for s in data["steps"]] == [1, 2]
    for s in data["steps"]:
        # rank 1 computes 1.6x rank 0's work: up to 0.6 of the balanced work is skew (less on a
        # loaded host, where the fast replica's sleeps overshoot too)
        assert s["verdict"] == "R3" and 0 < s["classes_ms"]["R3"] < 0.75 * s["work_ms"], s
        assert s["t_lb_ms"] < s["observed_ms"]
        png = slow_replica / "analysis" / f"gantt-step{s['step']}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_pipeline_bubble_is_named_a_structural_orphan(pipeline):
    console = Console(record=True, width=200, file=io.StringIO())
    print_analysis(analyze_target(pipeline), console)
    assert "H1 structural orphan, hard" in verdict_line(console.export_text())
    data = json.loads((pipeline / "analysis" / "analysis.json").read_text())
    for s in data["steps"]:
        # 1F1B, 4 stages, 4 microbatches of 30 ms: the bubble is 3 of 7 slots
        assert s["classes_ms"]["H1"] == pytest.approx(90, rel=0.35), s
        assert {int(link.split()[0][1:]) for link in s["binding_chain"] if "compute" in link} == {0, 1, 2, 3}


def test_exported_trace_nests_and_chakra_files_read_back(pipeline, run_prism, tmp_path):
    res = run_prism("export", str(pipeline), "--out", str(tmp_path / "t.json"), "--chakra", str(tmp_path / "et"))
    assert res.returncode == 0, res.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    assert check_nesting(trace) > 100
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf" and e["cat"] == "p2p"]
    assert len(flows) == 2 * 3 * 2 * 4 * 3  # a start and a finish per message: 3 links, 2 ways, 4 microbatches, 3 steps
    for rank in range(4):
        meta, nodes = read_chakra(tmp_path / "et" / f"prism.{rank}.et")
        assert meta.version and len(nodes) > 10


def test_a_directory_without_a_graph_or_an_emulation_is_named(tmp_path):
    with pytest.raises(RunDirError, match=r"neither an emulation directory \(report.json\) nor a run"):
        analyze_target(tmp_path)
