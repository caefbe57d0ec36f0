"""A script that checkpoints at its end and resumes from the latest checkpoint it finds: every
prism run of it (record, collect, the capture run, the calibration slice, the emulation) starts from
the same world, takes the fresh path, leaves what it wrote under RUN/outputs/<phase>/, and the
script's folder is unchanged afterwards."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import Isolation, ValuesPolicy, load_job
from prism.graph.compare import match_ratio
from prism.graph.records import CommOp
from prism.sandbox.recording import record_job
from prism.core.errors import RankFailedError
from prism.core.isolation import outside_writes
from prism.core.rundir import RunDir
from prism.graph.io import read_graph
from prism.vrank_replayer import EmulateOptions, capture_job, emulate
from prism.vrank_replayer.calibrate_run import calibrate_run
from tests.conftest import ASSETS

pytestmark = pytest.mark.timeout(300)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if "__pycache__" not in p.parts}


@pytest.fixture
def script_dir(tmp_path):
    folder = tmp_path / "user-script"
    shutil.copytree(ASSETS / "jobs" / "resume2", folder)
    return folder


def test_record_collect_calibrate_and_emulate_all_take_the_fresh_path(script_dir, tmp_path):
    before = tree(script_dir)
    job = load_job(script_dir / "job.yaml")
    run = tmp_path / "run"
    real = record_job(job, run)
    fresh = {r: len(real.comm_nodes(r)) for r in (0, 1)}
    assert not any(n.op is CommOp.BROADCAST for r in (0, 1) for n in real.comm_nodes(r))  # not the resume path
    # A second record into the same run directory: the first one's checkpoint is not found.
    again = record_job(job, run)
    assert again.summaries[0].losses == real.summaries[0].losses

    collected = collect_job(dataclasses.replace(job, values=ValuesPolicy(ranks="0")), run,
                            CollectOptions(slots=2, timeout_s=240)).graph
    for r in (0, 1):
        assert match_ratio(real.nodes[r], real.groups, collected.nodes[r], collected.groups) == 1.0
        assert collected.summaries[r].losses == real.summaries[r].losses

    calibrate_run(run, slice_size=2, timeout_s=240)
    emulated = emulate(run, EmulateOptions(ranks=(0,), timeout_s=240))
    assert emulated.ranks[0].diverged_ops == ()
    assert emulated.ranks[0].num_ops == fresh[0]
    assert emulated.ranks[0].losses == collected.summaries[0].losses
    assert emulated.extra["outside_writes"] == []

    outputs = run / "outputs"
    phases = ["record", "collect", "capture", "calibrate/slice-000",
              f"emulate/{emulated.out_dir.parent.name}-{emulated.out_dir.name}"]
    for phase in phases:
        # Each run wrote its own first checkpoint (step 3): none of them resumed.
        ckpt = torch.load(outputs / phase / "checkpoints" / "step-0003.pt")
        assert ckpt["step"] == 3, phase
        assert not (outputs / phase / "checkpoints" / "step-0006.pt").exists(), phase
        assert (outputs / phase / "train-rank0.log").read_text() == "started at step 0\n", phase
        summary = json.loads((outputs / f"{phase}.json").read_text())
        assert "checkpoints/step-0003.pt" in summary["written"] and summary["outside"] == [], phase
    assert not (outputs / "emulate" / phases[-1].split("/")[1] / "train-rank1.log").exists()  # rank 1 was virtual
    assert tree(script_dir) == before
    assert not list((run / "work").iterdir())  # the working copies are gone


def test_writes_outside_are_reported_and_extra_paths_are_reset_and_put_back(script_dir, tmp_path, caplog):
    ckpts = tmp_path / "ckpts"  # an absolute checkpoint folder outside the script's folder
    ckpts.mkdir()
    (ckpts / "README").write_text("the user's own file\n")
    beside = script_dir / "written-beside.txt"
    job = load_job(script_dir / "job.yaml")
    job = dataclasses.replace(job, env={"CKPT_DIR": str(ckpts), "WRITE_OUTSIDE": str(beside)},
                              isolation=Isolation(extra=(str(ckpts),)))
    run = tmp_path / "run"
    first = record_job(job, run)
    second = record_job(job, run)  # would resume from ckpts/step-0003.pt without the reset
    assert second.summaries[0].losses == first.summaries[0].losses
    assert sorted(p.name for p in ckpts.iterdir()) == ["README"]  # put back as it was
    out = run / "outputs" / "record"
    assert torch.load(out / "extra" / f"0-{ckpts.name}" / "step-0003.pt")["step"] == 3
    summary = json.loads((run / "outputs" / "record.json").read_text())
    assert summary["outside"] == [f"{beside} (changed)"]  # the first run added it, the second changed it
    # On CPU `prism record` runs the script twice (a memory pass, then the timed one): both wrote it.
    assert outside_writes(run) == [f"record-memory-pass: {beside} (changed)", f"record: {beside} (changed)"]
    assert any("wrote outside its working directory" in r.getMessage() and str(beside) in r.getMessage()
               for r in caplog.records)


@pytest.fixture(scope="module")
def run_with_data_of_another_size(tmp_path_factory):
    # The structure graph comes from one run of the script and the recorded data from another that
    # took another path (here: another size; in the field, a checkpoint that run resumed from).
    job = load_job(ASSETS / "jobs" / "resume2" / "job.yaml")
    run = tmp_path_factory.mktemp("another-size") / "run"
    record_job(dataclasses.replace(job, env={"NUMEL": "16384"}), run)
    capture_job(dataclasses.replace(job, env={"NUMEL": "4"}), run, derive_for=(0, 1), timeout_s=240)
    return run


@pytest.fixture(scope="module")
def run3_with_data_of_another_size(tmp_path_factory):
    job = dataclasses.replace(load_job(ASSETS / "jobs" / "resume2" / "job.yaml"), world_size=3)
    run = tmp_path_factory.mktemp("another-size-3") / "run"
    record_job(dataclasses.replace(job, env={"NUMEL": "16384"}), run)
    capture_job(dataclasses.replace(job, env={"NUMEL": "4"}), run, derive_for=(0, 1, 2), timeout_s=240)
    return run


def test_a_recorded_input_of_another_size_is_a_divergence_when_every_member_is_real(run3_with_data_of_another_size):
    # Every member of a group of three real (a calibration slice): prism's ring runs the ops,
    # flagged as diverged.
    every = emulate(run3_with_data_of_another_size, EmulateOptions(ranks=(0, 1, 2), timeout_s=240))
    assert any(op.startswith("all_reduce ") for op in every.ranks[0].diverged_ops)


def test_a_pair_of_real_ranks_runs_the_jobs_own_ops_and_reads_no_recorded_data(run_with_data_of_another_size):
    # Both members of a pair real: their group runs on gloo as in the real run (docs/emulate.md,
    # "Pairs of real ranks run the real backend"), so the data recorded by another path is not
    # read, and the losses are the recorded run's own.
    both = emulate(run_with_data_of_another_size, EmulateOptions(ranks=(0, 1), timeout_s=240))
    real = read_graph(RunDir(run_with_data_of_another_size).graph_dir("real"))
    for r in (0, 1):
        assert both.ranks[r].num_ops == 0  # none through prism's pruned ring
        assert [repr(x) for x in both.ranks[r].losses] == [repr(x) for x in real.summaries[r].losses]


@pytest.mark.parametrize("device_path", ["host", "lanes"])
def test_a_recorded_input_of_another_size_stops_the_emulation_naming_the_op_and_both_sizes(
        run_with_data_of_another_size, device_path):
    # A virtual peer would replay values of the wrong size: the emulation stops before any transfer
    # of the op (on a delegated path the replayer checks, as NCCL would otherwise hang on it).
    with pytest.raises(RankFailedError) as err:
        emulate(run_with_data_of_another_size, EmulateOptions(ranks=(0,), timeout_s=240, device_path=device_path))
    text = str(err.value) + err.value.traceback_text
    assert "all_reduce on group" in text and "float32[16384]" in text and "float32[4]" in text
    assert "must match the size" not in text and "Received data size" not in text
