"""Hangs explain themselves (issue 12): a mismatched collective stops ``prism record`` and
``prism emulate`` within seconds, naming the rank, the op and the shapes; a rank that finishes while
its peers wait for it is named at once; a stalled rank is reported with every rank's pending op once no rank made progress for the timeout. Every run gets a long ``--timeout`` except the
stall, so stopping early is the point."""

import json
import re
import time

import pytest
import yaml

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.vrank_replayer import capture_job
from tests.conftest import ASSETS, processes_tagged

pytestmark = pytest.mark.timeout(400)

MISMATCH = ASSETS / "jobs/mismatch4"
LONG = "300"


def detected_after_s(text: str) -> float:
    m = re.search(r"\(detected ([0-9.]+) s after the last of them was issued\)", text)
    assert m, text
    return float(m.group(1))


def test_a_mismatched_all_reduce_stops_record_at_once_naming_rank_2_the_op_and_the_shapes(tmp_path, run_prism):
    started = time.monotonic()
    result = run_prism("record", "--job", str(MISMATCH / "job.yaml"), "--out", str(tmp_path / "run"), "--timeout", LONG)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "collective mismatch at group 0 seq 1:" in err
    # rank 2 is named with its op; the others with theirs (a rank slowed down by the machine may not
    # have issued it yet when the report is written)
    assert "  rank 2 issued all_reduce sum on group 0 seq 1 f32 (5,) at train.py:12\n" in err
    others = re.search(r"while ranks? ([0-9,-]+) issued all_reduce sum on group 0 seq 1 f32 \(4,\) at train.py:12", err)
    assert others and "2" not in others.group(1), err
    assert re.search(r"rank 2: .*all_reduce sum on group 0 seq 1 f32 \(5,\) at train.py:12", err), err
    assert detected_after_s(err) < 10
    assert elapsed < float(LONG) / 2
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert failure["kind"] == "mismatch" and failure["error"] == "collective mismatch at group 0 seq 1:"
    assert processes_tagged(run_prism.tag) == []
    assert not (tmp_path / "run" / "graph" / "real").exists()


def test_a_rank_that_finishes_while_its_peers_wait_for_it_is_named_at_once(tmp_path, run_prism):
    result = run_prism("record", "--job", str(ASSETS / "jobs/skip_rank3/job-deadlock.yaml"),
                       "--out", str(tmp_path / "run"), "--timeout", LONG)
    assert result.returncode == 2, result.stderr
    assert ("deadlock: rank 3 finished without issuing all_reduce sum on group 0 seq 2 f32 (4,) at train.py:18, "
            "which rank") in result.stderr
    assert "rank 3: finished; its last op all_reduce sum on group 0 seq 1 f32 (4,)" in result.stderr
    assert processes_tagged(run_prism.tag) == []


def test_a_stalled_rank_is_reported_after_the_timeout_without_progress_with_every_rank_s_pending_op(tmp_path, run_prism):
    result = run_prism("record", "--job", str(ASSETS / "jobs/stall_rank3/job.yaml"), "--out", str(tmp_path / "run"),
                       "--timeout", "25")
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "no progress for 25 s (--timeout): no rank issued or completed a comm op; ranks still running: 0-3" in err
    for r in range(3):
        assert f"rank {r}: waits in all_reduce sum on group 0 seq 1 f32 (4,) at train.py:14 (issued" in err
    assert "rank 3: no comm op pending; its last op all_reduce sum on group 0 seq 0 f32 (4,) at train.py:14" in err
    assert "all_reduce sum on group 0 seq 1 f32 (4,) at train.py:14: ranks 0-2 issued it, 3 not yet" in err
    assert json.loads((tmp_path / "run" / "failure.json").read_text())["kind"] == "hang"
    assert processes_tagged(run_prism.tag) == []


@pytest.fixture(scope="module")
def changed_run(tmp_path_factory):
    """A run of the good job (recorded, captured, recorded data of ranks 1,2); then the user changes
    rank 2's code (here: its environment) so that it all-reduces 5 elements."""
    run = tmp_path_factory.mktemp("hangs") / "run"
    job = load_job(MISMATCH / "job-good.yaml")
    record_job(job, run, timeout_s=300)
    capture_job(job, run, derive_for=(1, 2), timeout_s=300)
    frozen = yaml.safe_load((run / "job.yaml").read_text())
    frozen["env"] = {"MISMATCH_RANK": "2"}
    (run / "job.yaml").write_text(yaml.safe_dump(frozen))
    return run


def test_a_mismatched_all_reduce_stops_emulate_at_once_naming_rank_2_the_op_and_the_shapes(changed_run, run_prism):
    result = run_prism("emulate", str(changed_run), "--ranks", "1,2", "--graph", "real", "--timeout", LONG)
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "collective mismatch at group 0 seq 1:" in err
    assert "rank 2 issued all_reduce sum on group 0 seq 1 f32 (5,) at train.py:12" in err
    # against rank 1's op, or, if rank 2 failed before rank 1 issued it, the recorded one
    assert re.search(r"(rank 1 issued|where the recorded run has) all_reduce sum on group 0 seq 1 f32 \(4,\) "
                     r"at train.py:12", err), err
    assert processes_tagged(run_prism.tag) == []


def test_a_lone_sandbox_rank_that_differs_from_the_recorded_op_is_named_with_both_shapes(changed_run, run_prism):
    started = time.monotonic()
    result = run_prism("emulate", str(changed_run), "--ranks", "2", "--graph", "real", "--timeout", LONG)
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert ("collective mismatch at group 0 seq 1:\n"
            "  rank 2 issued all_reduce sum on group 0 seq 1 f32 (5,) at train.py:12\n"
            "  where the recorded run has all_reduce sum on group 0 seq 1 f32 (4,) at train.py:12 "
            "(which its virtual peers replay)") in err
    assert time.monotonic() - started < float(LONG) / 2
    assert processes_tagged(run_prism.tag) == []
