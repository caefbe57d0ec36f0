"""A node's task killed in the middle of a Slurm run: the job ends with a message naming the node,
and no process of the run is left on any node."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from tests.conftest import EXAMPLES, processes_tagged

pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


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


def test_killing_a_sandbox_nodes_task_stops_the_job_naming_the_node(slurm_cluster, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "ddp2-long", "entrypoint": str(EXAMPLES / "ddp" / "train.py"), "args": ["--steps", "200"],
        "world_size": 2, "ranks_per_node": 2, "device": "cpu", "slots": 2,
        "parallelism": {"dp": 2, "tp": 1, "pp": 1, "ep": 1, "cp": 1}}))
    out = tmp_path / "job.out"
    tag = uuid.uuid4().hex
    env = {**slurm_cluster.env, "PRISM_TEST_TAG": tag, "PRISM_LOST_AFTER_S": "3"}
    sbatch = subprocess.Popen(
        [sys.executable, "-m", "prism.cli.main", "collect", "--job", str(job), "--out", str(tmp_path / "run"),
         "--launcher", "slurm", "--submit", "--nodes", "3", "--tasks-per-node", "1",
         "--sbatch-arg=--wait", "--sbatch-arg=--time=3", f"--sbatch-arg=--output={out}"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _on_node(tag, "n2", "prism.sandbox.worker"):  # a rank worker runs on the sandbox node
            assert sbatch.poll() is None, f"the job ended early:\n{out.read_text() if out.exists() else ''}"
            assert time.monotonic() < deadline, "no rank worker started on n2"
            time.sleep(0.2)
        # the oldest: a child between fork and exec still shows its parent's command line
        agent = min(_on_node(tag, "n2", "slurm-task"), key=lambda p: p.create_time())
        os.kill(agent.pid, signal.SIGKILL)
        printed, _ = sbatch.communicate(timeout=120)
    finally:
        if sbatch.poll() is None:
            sbatch.kill()
            slurm_cluster.cancel_all()
    text = out.read_text()
    assert sbatch.returncode != 0, printed
    assert "node n2 lost" in text and "sandbox agent 0" in text, text
    assert "rank " in text and " on n2 failed" in text, text
    deadline = time.monotonic() + 15  # slurmstepd reaps its tasks within a few seconds
    while _alive(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(tag) == []
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""
