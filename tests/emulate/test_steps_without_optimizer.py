"""Steps of programs that step no optimizer: found from the period of each rank's comm sequence
(examples/pp_sleep_noopt: a hand-written 1F1B over send/recv with sleep compute), or, when the
sequence does not repeat, one line that says so and names the fix, and no ``nan`` anywhere."""

from __future__ import annotations

import json
import os
import re

import pytest

from prism.graph.io import read_graph
from tests.conftest import ASSETS, EXAMPLES

pytestmark = pytest.mark.timeout(900)

NAN = re.compile(r"\bnan\b", re.IGNORECASE)
FIX = "no iteration boundary found for rank"
TARGET = 0.015 if os.environ.get("PRISM_TIMING_TESTS") else 0.5
"""The acceptance figure (issue 11: within 1.5 % on the 2-core machine) holds only on a quiet host, so
it is asserted with PRISM_TIMING_TESTS=1; otherwise the test checks that the emulation tracks the
real run at all (machines shared by several test runs give +15 to +30 %, docs/emulate.md)."""


def test_pp_sleep_noopt_steps_are_found_and_emulated(run_prism, tmp_path):
    out = tmp_path / "validate.json"
    proc = run_prism("validate", "--job", str(EXAMPLES / "pp_sleep_noopt/job.yaml"), "--ranks", "1,2",
                     "--out", str(tmp_path / "run"), "--json", str(out), "--no-torch-fake", "--timeout", "300",
                     timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not NAN.search(proc.stdout) and FIX not in proc.stdout
    real = read_graph(tmp_path / "run" / "graph" / "real")
    for rank in range(4):  # 30 steps: the script's --steps (the last stage's by its waits)
        assert len(real.summaries[rank].step_times_ns) == 30, rank
    result = json.loads(out.read_text())
    for rank in ("1", "2"):
        t = result["ranks"][rank]["prism"]["time"]
        assert t["num_steps"] == 28, t  # 30 steps, 2 warmup
        assert 60 < t["real_mean_ms"] < 200, t
        assert abs(t["mean_rel_error"]) <= TARGET, t
        # No step ends while the job runs, so the whole run's peak is the one compared; the sends'
        # divergence check reads recorded values on the script's thread and must not count them.
        run_peak = result["ranks"][rank]["prism"]["peaks"]["run"]
        assert run_peak["equal"] and run_peak["emulated_bytes"] > 0, run_peak


def test_a_run_without_steps_says_so_in_one_line_and_prints_no_nan(run_prism, tmp_path):
    job = str(ASSETS / "jobs/no_steps/job.yaml")
    run = str(tmp_path / "run")
    outputs = {}
    proc = run_prism("record", "--job", job, "--out", str(tmp_path / "recorded"))
    outputs["record"] = proc
    proc = run_prism("validate", "--job", job, "--ranks", "1", "--out", run, "--json", str(tmp_path / "v.json"),
                     "--timeout", "300", timeout=600)
    outputs["validate"] = proc
    outputs["calibrate"] = run_prism("calibrate", run, "--json", str(tmp_path / "c.json"), "--repeats", "2",
                                     "--merge", "median", timeout=400)
    outputs["emulate"] = run_prism("emulate", run, "--ranks", "1")
    outputs["emulate --json"] = run_prism("emulate", run, "--ranks", "1", "--json")
    for name, proc in outputs.items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        text = proc.stdout + proc.stderr
        assert not NAN.search(text), (name, text)
        if name != "emulate --json":
            lines = [line for line in text.splitlines() if FIX in line]
            assert len(lines) == 1, (name, text)
            assert "iterations.boundary" in lines[0] and "prism.mark_step()" in lines[0]
    for path in ("v.json", "c.json"):
        text = (tmp_path / path).read_text()
        assert not NAN.search(text), (path, text)
        json.loads(text)
    # --repeats 2: each slice ran twice (the second take in slice-<i>-1)
    assert sorted(p.name for p in (tmp_path / "run" / "calibration").iterdir()) == ["slice-000", "slice-000-1"]
    bad = run_prism("calibrate", run, "--repeats", "0")
    assert bad.returncode == 2 and "--repeats: must be at least 1, got 0" in bad.stderr
    emulated = json.loads(outputs["emulate --json"].stdout)
    assert emulated["ranks"]["1"]["step_ms"] == [] and emulated["ranks"]["1"]["mean_ms"] is None
    calibrated = json.loads((tmp_path / "c.json").read_text())
    assert calibrated["ranks_without_steps"] == [0, 1] and calibrated["merge"] == "median"
