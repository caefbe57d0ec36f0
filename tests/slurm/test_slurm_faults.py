"""A node's task killed in the middle of a Slurm run: the job ends with a message naming the node,
and no process of the run is left on any node."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import EXAMPLES, processes_tagged
from tests.slurm.conftest import _ports

pytestmark = [pytest.mark.timeout(200), pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one cluster per worker


def _on_node(tag: str, node: str, needle: str) -> list[psutil.Process]:
    found = []
    for p in processes_tagged(tag):
        try:
            if p.environ().get("SLURMD_NODENAME") == node and needle in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(tag: str) -> list[str]:
    out = []
    for p in processes_tagged(tag):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return out


def _submit_long_collect(cluster, tmp_path, tag: str) -> tuple[subprocess.Popen, Path]:
    """A collection that runs for minutes, submitted with sbatch --wait; returns once a rank worker
    runs on the sandbox node n2."""
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "ddp2-long", "entrypoint": str(EXAMPLES / "ddp" / "train.py"), "args": ["--steps", "200"],
        "world_size": 2, "ranks_per_node": 2, "device": "cpu", "slots": 2,
        "parallelism": {"dp": 2, "tp": 1, "pp": 1, "ep": 1, "cp": 1}}))
    out = tmp_path / "job.out"
    # A free port of its own: the default (20000 + job id) was held by another process on CI twice
    env = {**cluster.env, "PRISM_TEST_TAG": tag, "PRISM_LOST_AFTER_S": "3", "PRISM_PORT": str(_ports(1))}
    sbatch = subprocess.Popen(
        [sys.executable, "-m", "prism.cli.main", "collect", "--job", str(job), "--out", str(tmp_path / "run"),
         "--launcher", "slurm", "--submit", "--nodes", "3", "--tasks-per-node", "1",
         "--sbatch-arg=--wait", "--sbatch-arg=--time=3", f"--sbatch-arg=--output={out}"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not _on_node(tag, "n2", "prism.sandbox.worker"):
        if sbatch.poll() is not None or time.monotonic() > deadline:
            sbatch.kill()
            cluster.cancel_all()
            pytest.fail(f"no rank worker started on n2:\n{out.read_text() if out.exists() else ''}")
        time.sleep(0.2)
    return sbatch, out


def _ended(cluster, sbatch: subprocess.Popen, tag: str) -> str:
    """Waits for the job's end; returns what sbatch printed. Then no process of the run may remain."""
    try:
        printed, _ = sbatch.communicate(timeout=120)
    finally:
        if sbatch.poll() is None:
            sbatch.kill()
            cluster.cancel_all()
    # slurmstepd reaps its tasks within a few seconds; a cancelled job may show as completing (CG)
    # for as long after sbatch --wait returned
    deadline = time.monotonic() + 15
    while (_alive(tag) or cluster.run("squeue", "-h").stdout.strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(tag) == []
    assert cluster.run("squeue", "-h").stdout.strip() == ""
    return printed


def test_killing_a_sandbox_nodes_task_stops_the_job_naming_the_node(slurm_cluster, tmp_path):
    tag = uuid.uuid4().hex
    sbatch, out = _submit_long_collect(slurm_cluster, tmp_path, tag)
    # the oldest: a child between fork and exec still shows its parent's command line
    agent = min(_on_node(tag, "n2", "slurm-task"), key=lambda p: p.create_time())
    os.kill(agent.pid, signal.SIGKILL)
    printed = _ended(slurm_cluster, sbatch, tag)
    text = out.read_text()
    assert sbatch.returncode != 0, printed
    assert "node n2 lost" in text and "sandbox agent 0" in text, text
    assert "error: rank 0 on n2 failed" in text or "error: rank 1 on n2 failed" in text, text
    assert not (tmp_path / "run" / "graph" / "bare").exists()


def test_scancel_leaves_no_process_of_the_run(slurm_cluster, tmp_path):
    tag = uuid.uuid4().hex
    sbatch, out = _submit_long_collect(slurm_cluster, tmp_path, tag)
    slurm_cluster.run("scancel", *slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split())
    _ended(slurm_cluster, sbatch, tag)  # (sbatch --wait itself exits 0 for a cancelled job in Slurm 22.05)
    text = out.read_text()
    assert "CANCELLED" in text and "prism slurm-task stopped by SIGTERM" in text, text
