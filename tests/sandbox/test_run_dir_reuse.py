"""Writing a recording into a run directory that already holds one: the same program keeps the
run's collected and calibrated data; another program is refused unless ``--force`` replaces it; a
user's own job file is never overwritten. ``python -m prism.record`` under a user's launcher: a
plain launch (srun, a shell; rank 0 hosts the store) and torchrun (its agent hosts it)."""

import os
import socket
import subprocess
import sys

import pytest

from prism.core.config import load_job
from prism.core.errors import RunDirError
from prism.core.rundir import RunDir
from prism.graph.io import read_graph
from prism.graph.memory_pass import timed_with_tracker

pytestmark = pytest.mark.timeout(180)

SCRIPT = """import argparse, torch, torch.distributed as dist
p = argparse.ArgumentParser(); p.add_argument("--n", type=int, default=4); a = p.parse_args()
dist.init_process_group("gloo")
for _ in range(3):
    t = torch.ones(a.n); dist.all_reduce(t)
dist.destroy_process_group()
"""


def write_job(directory, n: int):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(SCRIPT)
    path = directory / "job.yaml"
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_prism_record(tmp_path, out, n: int) -> list[subprocess.CompletedProcess]:
    """``python -m prism.record`` as a plain launcher starts it: W=2 processes with RANK, WORLD_SIZE, MASTER_*."""
    port = free_port()
    (tmp_path / "train.py").write_text(SCRIPT)
    procs = [subprocess.Popen([sys.executable, "-m", "prism.record", "--out", str(out), "train.py", "--n", str(n)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(2)]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs)]


def test_prism_record_under_a_users_launcher_refuses_another_programs_run(tmp_path):
    out = tmp_path / "run"
    first = launch_prism_record(tmp_path, out, 4)
    assert [p.returncode for p in first] == [0, 0], first[0].stderr + first[1].stderr
    assert RunDir(out).load_job().args == ("--n", "4")
    assert (out / "graph" / "real" / "manifest.pb").is_file()
    again = launch_prism_record(tmp_path, out, 8)
    for p in again:  # every rank stops before running the script, with the reason in one line
        assert p.returncode != 0
        assert "holds a run of another program (args: ['--n', '4'] there, ['--n', '8'] now)" in p.stderr
        assert "remove it, or choose another --out" in p.stderr and "Traceback" not in p.stderr
    assert RunDir(out).load_job().args == ("--n", "4")


def test_prism_record_under_torchrun_uses_its_agents_store(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port())]
    result = subprocess.run([*torchrun, "-m", "prism.record", "--out", "run", "train.py"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert RunDir(tmp_path / "run").load_job().world_size == 2
    # one run of a CPU job, the memory tracker in its steps: the graph says so, and calibrate and
    # emulate warn before comparing times with it
    assert timed_with_tracker(read_graph(tmp_path / "run" / "graph" / "real").meta)


def test_prism_record_across_slurm_nodes_without_master_addr_says_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}
    result = subprocess.run([sys.executable, "-m", "prism.record", "--out", "run", "train.py"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env=dict(env, SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_NNODES="2"))
    assert result.returncode == 1
    assert "MASTER_ADDR is not set and the job spans 2 nodes; export MASTER_ADDR" in result.stderr
