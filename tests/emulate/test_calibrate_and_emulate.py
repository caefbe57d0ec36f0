"""End to end on CPU with the synthetic timing job (sleep compute, dp2 x pp2 1F1B, W=4): the real
run, ``prism calibrate`` (slices of 2 ranks, the others virtual) writes a timed graph whose
iteration time is close to the real run's, and ``prism emulate`` of ranks {1, 2} on the timed
clock writes report.json and timeline.json with the real run's losses and close iteration times."""

import dataclasses
import json
import os
import pickle
import shutil
import statistics

import pytest

from prism.core.config import load_job
from prism.core.errors import PrismError
from prism.graph.io import read_graph
from prism.graph.records import NodeKind
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run, calibration_takes
from prism.vrank_replayer.emulate_report import emulate_and_report
from tests.conftest import EXAMPLE_JOBS

pytestmark = pytest.mark.timeout(900)

SANDBOX = (1, 2)
SLOW_STAGE_SLEEP_MS = 4 * (10 + 20) * 1.5
"""The slow stage's own sleeps per step (4 microbatches of 10 + 20 ms, 1.5x): every rank's step is
at least this long, since the 1F1B pipeline runs at the pace of its slowest stage."""
TIGHT = bool(os.environ.get("PRISM_TIMING_TESTS"))
"""Closeness to the real run (within 15 % / 20 %) holds on a quiet host and is asserted with
PRISM_TIMING_TESTS=1; on a loaded one the real run's 4 processes stretch every sleep by tens of
percent (327 ms measured against a 220 ms calibration at load 9), so the default run asserts what
does not depend on load: the pipeline's waits are in the prediction, and it is the right order.
The fidelity figures live in bench/emulate_fidelity.py."""


def close_to(value_ms: float, real_ms: float, rel: float) -> bool:
    if TIGHT:
        return value_ms == pytest.approx(real_ms, rel=rel)
    return SLOW_STAGE_SLEEP_MS <= value_ms <= 2 * real_ms


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    job = load_job(EXAMPLE_JOBS["synthetic"])
    job = dataclasses.replace(
        job, world_size=4, ranks_per_node=4, parallelism=dataclasses.replace(job.parallelism, dp=2, pp=2),
        args=("--steps", "3", "--dp", "2", "--pp", "2", "--microbatches", "4", "--fwd-ms", "10", "--bwd-ms", "20",
              "--slow-stage", "1", "--slow-factor", "1.5"))
    run = tmp_path_factory.mktemp("synthetic-w4")
    real = record_job(job, run)
    result = calibrate_run(run, slice_size=2, timeout_s=300)
    return run, real, result


def measured_ms(real, rank, skip=1):
    return statistics.fmean(real.summaries[rank].step_times_ns[skip:]) / 1e6


def test_calibrate_writes_a_timed_graph_close_to_the_real_run(calibrated):
    run, real, result = calibrated
    timed = read_graph(run / "graph" / "timed")
    assert timed.kind == "timed" and sorted(timed.nodes) == [0, 1, 2, 3]
    assert [s.ranks for s in result.slices] == [(0, 1), (2, 3)]
    # the host timed before the first take and after each, kept in the timed graph
    assert len(result.host_probe_ms) == 3 and all(p > 0 for p in result.host_probe_ms)
    assert timed.meta["host_probe_ms"] == ",".join(f"{p:.3f}" for p in result.host_probe_ms)
    assert not result.real_timed_with_tracker  # recorded in two passes: its steps ran untracked
    for rank, rc in result.report.ranks.items():
        real_ms = measured_ms(real, rank)
        # slices alone cannot see the pipeline's waits; calibration brings them back
        assert close_to(rc.calibrated_step_ns / 1e6, real_ms, 0.15), (rank, rc.calibrated_step_ns / 1e6, real_ms)
        assert result.real_steps_ns[rank] == real.summaries[rank].step_times_ns


def _compute_per_step(nodes) -> dict[int, int]:
    per: dict[int, int] = {}
    for n in nodes:
        if n.kind is NodeKind.COMPUTE:
            per[n.step] = per.get(n.step, 0) + n.duration_ns
    return per


def test_calibrate_by_default_times_each_step_by_one_take(calibrated, tmp_path):
    run, _, _ = calibrated
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("calibration", "emulations"))
    events = []
    result = calibrate_run(copy, slice_size=2, repeats=2, timeout_s=300,  # the default merge: rotated
                           on_slice=lambda done, total, ranks: events.append((done, total, ranks)),
                           between_rounds=lambda k: events.append(("between rounds", k)))
    # the takes run in rounds of every slice, so a drifting host moves both slices' takes alike
    assert events == [(0, 4, (0, 1)), (1, 4, (2, 3)), ("between rounds", 0), (2, 4, (0, 1)), (3, 4, (2, 3)), (4, 4, ())]
    assert len(result.host_probe_ms) == 5  # before the first take and after each
    timed = read_graph(copy / "graph" / "timed")
    assert timed.meta["merge"] == "rotated"
    for rank, slice_dir in ((0, "slice-000"), (3, "slice-001")):
        takes = [_compute_per_step(pickle.loads((copy / "calibration" / d / f"rank-{rank:05d}.pkl").read_bytes()).nodes)
                 for d in (slice_dir, f"{slice_dir}-1")]
        steps = _compute_per_step(timed.nodes[rank])
        # the warm-up step and measured step 1 from take 0, measured step 2 from take 1
        assert [steps[s] for s in (0, 1, 2)] == [takes[0][0], takes[0][1], takes[1][2]], (rank, steps, takes)
    # the takes read back, in take order, as the benchmark recomputes other merges from them
    read_back = calibration_takes(copy)
    assert sorted(read_back) == [0, 1, 2, 3]
    assert [_compute_per_step(t) for t in read_back[3]] == [
        _compute_per_step(pickle.loads((copy / "calibration" / d / "rank-00003.pkl").read_bytes()).nodes)
        for d in ("slice-001", "slice-001-1")]


def test_an_unknown_calibration_merge_is_refused_before_any_slice_runs(tmp_path):
    with pytest.raises(PrismError, match="calibration merge 'mean': one of median, rotated"):
        calibrate_run(tmp_path / "no-run", merge="mean")


def test_emulate_on_the_timed_clock_reports_times_memory_and_a_timeline(calibrated):
    run, real, _ = calibrated
    report = emulate_and_report(run, EmulateOptions(ranks=SANDBOX, timeout_s=300))
    data = json.loads((report.out_dir / "report.json").read_text())
    assert data["clock"] == "timed" and data["sandbox_ranks"] == list(SANDBOX)
    # both timed runs untracked (two passes each): no warning about the tracker's cost
    assert "recorded_timed_with_tracker" not in data and "sandbox_timed_with_tracker" not in data
    assert data["host_probe_ms"] > 0 and len(data["calibration_host_probe_ms"]) == 3
    assert data["host_speed_vs_calibration"] == pytest.approx(
        data["host_probe_ms"] / statistics.median(data["calibration_host_probe_ms"]) - 1)
    for r in SANDBOX:
        row = data["ranks"][str(r)]
        assert len(row["step_ms"]) == 3 and row["measured_steps"] == 2
        assert close_to(row["mean_ms"], measured_ms(real, r), 0.2), (r, row["mean_ms"], measured_ms(real, r))
        assert row["p50_ms"] > 0 and row["predicted_mean_ms"] > 0
        assert row["peak_memory_bytes"] > 0 and row["oom"] is False
        assert row["diverged_ops"] == []
        for a, b in zip(row["losses"], real.summaries[r].losses, strict=True):
            assert a == pytest.approx(b, rel=1e-5)
    trace = json.loads((report.out_dir / "timeline.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names) == [0, 1, 2, 3]
    assert names[1].endswith("(real)") and "virtual" in names[0]
    spans = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert spans == {0, 1, 2, 3}


def test_emulate_draws_a_gantt_chart_and_analyze_names_the_bubble(calibrated):
    from prism.cli.analyze import analyze_target

    run, _, _ = calibrated
    report = emulate_and_report(run, EmulateOptions(ranks=SANDBOX, timeout_s=300))
    assert (report.out_dir / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    analysis = analyze_target(report.out_dir)
    # 2 stages x 4 microbatches, stage 1 1.5x slower on both replicas: fill and drain idle, forced
    # by the dependencies (H1) whatever the host's load. The verdict is the largest class: H1, or
    # R1 (late launch) when a loaded host paced the run slower than its program allows (CI, 2 cores).
    classes = analysis.report.mean_classes_ns()
    assert classes["H1"] > 0 and analysis.report.largest_hard == "H1"
    assert analysis.report.verdict in ("H1", "R1"), classes
    assert all(s.lower_bound_ns > 0 and s.chain for s in analysis.report.steps)
    assert {p.name for p in analysis.gantts} == {"gantt-step1.png", "gantt-step2.png"}
