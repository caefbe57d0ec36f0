"""Acceptance: ``prism analyze`` on an emulation of examples/pp (4 stages, 1F1B, 4 microbatches;
ranks 1 and 2 real, 0 and 3 virtual on the timed clock) names the pipeline bubble (H1), with
T_lb and the binding chain. Compute is slept (``--sleep-ms``: 5 ms per layer forward, 10 backward)
so that it dominates a step and the host's load does not move it: with real matmuls the suite's
load made the sandbox ranks slower than their calibration, and H2 outgrew the bubble (CI,
sessions 33 and 34)."""

import dataclasses
import json

import pytest

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report
from tests.conftest import EXAMPLE_JOBS

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_analyze_names_the_bubble_of_an_examples_pp_emulation(tmp_path, run_prism):
    job = load_job(EXAMPLE_JOBS["pp"])
    job = dataclasses.replace(
        job, world_size=4, ranks_per_node=4, env={"OMP_NUM_THREADS": "1"},
        iterations=dataclasses.replace(job.iterations, warmup=1, measured=2),
        parallelism=dataclasses.replace(job.parallelism, dp=1, pp=4),
        args=("--steps", "3", "--pp", "4", "--schedule", "1f1b", "--microbatches", "4", "--microbatch-size", "16",
              "--dim", "64", "--layers-per-stage", "2", "--sleep-ms", "5"))
    run = tmp_path / "pp4"
    record_job(job, run)
    calibrate_run(run, slice_size=2, timeout_s=600)
    report = emulate_and_report(run, EmulateOptions(ranks=(1, 2), timeout_s=600))
    res = run_prism("analyze", str(report.out_dir))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "T_lb" in next(line for line in lines if line.startswith("verdict:"))
    # The bubble is the largest hard class. The overall verdict is H1 on a quiet host; on a loaded
    # one R1 can outgrow it: the vranks' times are the timed graph's prediction, the sandbox
    # ranks' the real ones, and the run is slower than the model of the two by their mismatch.
    assert "largest hard class: H1 structural orphan" in next(line for line in lines if line.startswith("recoverable"))
    data = json.loads((report.out_dir / "analysis" / "analysis.json").read_text())
    assert data["verdict"] in ("H1", "R1") and data["largest_hard"] == "H1"
    assert data["mean_classes_ms"]["H1"] > 0.05 * data["mean_observed_ms"]
    chains = [line for line in res.stdout.splitlines() if line.startswith("binding chain, step")]
    assert len(chains) == 2
    # What the schedule fixes, whatever the host's load: a step's chain runs through stage 0's
    # forward, which every later stage's first forward waits for, and on through stage 1's work,
    # the only way out of stage 0. Where it ends and which later stages it visits depend on which
    # rank was slowest in that step: on a loaded host a sandbox stage's real compute (its
    # backward, its optimizer step) can bind it without stage 3, or outlast stage 0.
    for chain in chains:
        path = chain.split("): ", 1)[1]
        assert "r0 compute" in path and "r1 compute" in path, chain
