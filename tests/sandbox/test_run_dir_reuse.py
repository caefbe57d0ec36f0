"""Writing a recording into a run directory that already holds one: the same program keeps the
run's collected and calibrated data; another program is refused unless ``--force`` replaces it; a
user's own job file is never overwritten."""

import pytest

from prism.core.config import load_job
from prism.core.errors import RunDirError
from prism.core.rundir import RunDir

pytestmark = pytest.mark.timeout(180)

SCRIPT = """import argparse, torch, torch.distributed as dist
p = argparse.ArgumentParser(); p.add_argument("--n", type=int, default=4); a = p.parse_args()
dist.init_process_group("gloo")
for _ in range(3):
    t = torch.ones(a.n); dist.all_reduce(t)
dist.destroy_process_group()
"""


def write_job(directory, n: int, name: str = "job.yaml"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(SCRIPT)
    path = directory / name
    path.write_text(f"name: reuse\nentrypoint: train.py\nargs: ['--n', '{n}']\nworld_size: 2\n")
    return path


def stale_marker(run):
    marker = run / "graph" / "timed" / "manifest.pb"
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"from the earlier recording")
    return marker


def test_the_same_program_keeps_the_run_and_another_one_is_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.save_job(load_job(write_job(tmp_path / "a", 4)))
    marker = stale_marker(run.root)
    # Only how prism runs the job changed (iterations): still the same program.
    same = write_job(tmp_path / "a", 4)
    same.write_text(same.read_text() + "iterations: {warmup: 2, measured: 1}\n")
    run.claim(load_job(same))
    assert marker.is_file()
    with pytest.raises(RunDirError, match=r"holds a run of another program \(args: \['--n', '4'\] there, "
                                          r"\['--n', '8'\] now\).*--force"):
        run.claim(load_job(write_job(tmp_path / "a", 8)))
    assert marker.is_file() and run.job_file.is_file()
    run.claim(load_job(write_job(tmp_path / "a", 8)), replace=True)
    assert list(run.root.iterdir()) == []


def test_a_users_job_file_in_the_run_directory_is_not_overwritten(tmp_path):
    job = write_job(tmp_path, 4)
    with pytest.raises(RunDirError, match="job.yaml: not a run's frozen job"):
        RunDir(tmp_path).claim(load_job(job))
    assert job.read_text().startswith("name: reuse")


def test_record_refuses_another_programs_run_and_force_replaces_it(tmp_path, run_prism):
    out = str(tmp_path / "run")
    assert run_prism("record", "--job", str(write_job(tmp_path / "a", 4)), "--out", out).returncode == 0
    marker = stale_marker(tmp_path / "run")
    refused = run_prism("record", "--job", str(write_job(tmp_path / "b", 8)), "--out", out)
    assert refused.returncode == 2
    assert "holds a run of another program" in refused.stderr and "Traceback" not in refused.stderr
    assert RunDir(tmp_path / "run").load_job().args == ("--n", "4")
    forced = run_prism("record", "--job", str(write_job(tmp_path / "b", 8)), "--out", out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not marker.exists()
    assert RunDir(tmp_path / "run").load_job().args == ("--n", "8")
    assert (tmp_path / "run" / "graph" / "real" / "manifest.pb").is_file()
