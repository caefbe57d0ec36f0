"""A real Slurm cluster for the session: deploy/slurm/ci-cluster.sh up (3 slurmd on this host), and down.

Tests that use ``slurm_cluster`` are skipped, with the reason, only when the cluster cannot be
brought up here (not root, no apt-get, or the script failed: its message says what)."""

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "ci-cluster.sh"
NODES = 3


@dataclass(frozen=True)
class Cluster:
    base: Path
    env: dict

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    def cancel_all(self) -> None:
        ids = self.run("squeue", "-h", "-o", "%i").stdout.split()
        if ids:
            self.run("scancel", *ids)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _ports(count: int) -> int:
    for _ in range(200):
        base = random.randrange(21000, 29000)
        if all(_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError("no free run of ports")


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip(f"Slurm tests need root to run slurmctld/slurmd (uid {os.geteuid()})")
    if not shutil.which("sbatch") and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    # Not under pytest's 0700 temporary folders: munged needs o+x on every folder above its socket.
    base = Path(tempfile.mkdtemp(prefix="prism-slurm-"))
    first = _ports(NODES + 1)
    env = dict(os.environ, NODES=str(NODES), CTLD_PORT=str(first), SLURMD_PORT=str(first + 1))
    up = subprocess.run(["bash", str(SCRIPT), "up", str(base)], env=env, capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "down", str(base)], env=env, capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"the Slurm cluster could not be brought up: {up.stderr.strip() or up.stdout.strip()}")
    cluster = Cluster(base, {**os.environ, "SLURM_CONF": str(base / "slurm/etc/slurm.conf"),
                             "PYTHONPATH": str(ROOT), "PRISM": f"{sys.executable} -m prism.cli.main -v",
                             "COLUMNS": "400"})
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        subprocess.run(["bash", str(SCRIPT), "down", str(base)], env=env, capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
