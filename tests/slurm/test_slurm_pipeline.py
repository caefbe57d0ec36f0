"""collect -> calibrate -> emulate through the real sbatch scripts on a 3-node Slurm cluster (node 0:
the head, node 1: rank workers, node 2: replayers), against the same commands on one host.

The job is the hybrid example (FSDP2 x TP x PP, W=8; ranks 0 and 1 real, 2 slots on n2, 2
replayer hosts on n3): 160 s at load 10 on the 2-core CI machine, about 10 minutes at load 30.
``PRISM_SLURM_SMALL=1`` adds the DDP example at W=2 (rank 0 real; 2 minutes at load 10)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prism.graph.compare import compare_comm_sequences
from prism.graph.io import read_graph
from tests.conftest import EXAMPLES
from tests.slurm.conftest import _ports

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one cluster per worker

JOB_LIMIT_S = 240  # sbatch --wait; Slurm's own --time limit ends a hung job first
SMALL = os.environ.get("PRISM_SLURM_SMALL") == "1"


def ddp2(path: Path, sandbox: str) -> dict:
    return {"name": "ddp2", "entrypoint": str(EXAMPLES / "ddp" / "train.py"), "args": ["--steps", "3"],
            "world_size": 2, "ranks_per_node": 2, "device": "cpu", "iterations": {"warmup": 1, "measured": 2},
            "parallelism": {"dp": 2, "tp": 1, "pp": 1, "ep": 1, "cp": 1}, "slots": 2, "values": {"ranks": sandbox}}


def hybrid(path: Path, sandbox: str) -> dict:
    # 2 steps (a warm-up and a measured one) instead of the example's 4: what the two hosts are
    # compared on does not need more, and every step runs in each collection, slice and emulation.
    data = yaml.safe_load((EXAMPLES / "hybrid" / "job.yaml").read_text())
    args = list(data["args"])
    args[args.index("--steps") + 1] = "2"
    return {**data, "entrypoint": str(EXAMPLES / "hybrid" / data["entrypoint"]), "args": args,
            "iterations": {"warmup": 1, "measured": 1}, "values": {"ranks": sandbox}}


CASES = [
    pytest.param(hybrid, "0,1", 2, 2, 8, 2, id="hybrid-w8", marks=pytest.mark.timeout(1800)),
    pytest.param(ddp2, "0", 1, 1, 2, 1, id="ddp-w2",
                 marks=[pytest.mark.timeout(600), pytest.mark.skipif(not SMALL, reason="PRISM_SLURM_SMALL=1 runs it")]),
]


def prism(*args: str, env: dict | None = None, cwd: Path | None = None,
          timeout: float = JOB_LIMIT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def submit(cluster, tmp: Path, tasks: int, limit_s: float, command: str, *args: str) -> tuple[int, str]:
    """``prism COMMAND ... --launcher slurm --submit`` with ``sbatch --wait``: (exit code, job output)."""
    out = tmp / f"{command}.out"
    try:
        done = prism(command, *args, "--launcher", "slurm", "--submit", "--nodes", "3", "--tasks-per-node", str(tasks),
                     "--sbatch-arg=--wait", f"--sbatch-arg=--time={math.ceil(limit_s / 60) + 1}",
                     f"--sbatch-arg=--output={out}", env={**cluster.env, "PRISM_PORT": str(_ports(1))}, cwd=tmp,
                     timeout=limit_s)  # a free port of its own: 20000 + job id was held by another process on CI
    except subprocess.TimeoutExpired:
        cluster.cancel_all()
        pytest.fail(f"prism {command} on Slurm did not finish in {limit_s:.0f} s:\n"
                    f"{out.read_text() if out.exists() else ''}")
    return done.returncode, (out.read_text() if out.exists() else "") + done.stdout + done.stderr


def report(run: Path) -> dict:
    (path,) = run.rglob("emulations/**/report.json")
    return json.loads(path.read_text())


@pytest.mark.parametrize("make_job, sandbox, tasks, slice_size, world, num_sandbox", CASES)
def test_collect_calibrate_emulate_across_three_slurm_nodes_match_one_host(
        slurm_cluster, tmp_path, make_job, sandbox, tasks, slice_size, world, num_sandbox):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(make_job(job, sandbox)))
    limit_s = JOB_LIMIT_S * (2 if world > 2 else 1)
    local, remote = tmp_path / "local", tmp_path / "slurm"
    for argv in (("collect", "--job", str(job), "--out", str(local)),
                 ("emulate", str(local), "--ranks", sandbox, "--asap")):
        done = prism(*argv, env=slurm_cluster.env, cwd=tmp_path, timeout=limit_s)
        assert done.returncode == 0, done.stderr

    code, text = submit(slurm_cluster, tmp_path, tasks, limit_s, "collect", "--job", str(job), "--out", str(remote))
    assert code == 0, text
    # every agent joined the head, from its own node
    for role, node in (("sandbox", 2), ("assistant", 3)):
        for i in range(tasks):
            assert re.search(rf"joined: {role} agent {i} \(Slurm task \d+, pid \d+\) on n{node}", text), text
    code, text = submit(slurm_cluster, tmp_path, tasks, limit_s, "calibrate", str(remote), "--slice-size",
                        str(slice_size))
    assert code == 0, text
    assert (remote / "graph" / "timed").is_dir()
    code, text = submit(slurm_cluster, tmp_path, tasks, limit_s, "emulate", str(remote), "--ranks", sandbox)
    assert code == 0, text
    # rank 0 ran on the sandbox node, replayer 0 (process W + 0) on the assistant node
    assert re.search(r"process 0 \(launch \d+\) -> sandbox agent \d .* on n2", text), text
    assert re.search(rf"process {world} \(launch \d+\) -> assistant agent \d .* on n3", text), text

    one, many = read_graph(local / "graph" / "bare"), read_graph(remote / "graph" / "bare")
    for rank in range(world):
        diff = compare_comm_sequences(rank, one.nodes[rank], one.groups, many.nodes[rank], many.groups)
        assert diff is None, str(diff)
    a, b = report(local), report(remote)
    ranks = [int(r) for r in sandbox.split(",")]
    assert b["clock"] == "timed" and b["sandbox_ranks"] == a["sandbox_ranks"] == ranks
    assert len(ranks) == num_sandbox
    for r in map(str, ranks):
        ra, rb = a["ranks"][r], b["ranks"][r]
        assert rb["oom"] is False and rb["diverged_ops"] == [] == ra["diverged_ops"]
        for key in ("num_ops", "measured_steps"):
            assert rb[key] == ra[key], (r, key)
        # Peaks vary a little between two runs on one host, by when async comm buffers are freed
        # (the whole run's by 16 B on ddp; the measured steps' by up to 2 KiB on hybrid).
        assert rb["peak_memory_bytes"] == pytest.approx(ra["peak_memory_bytes"], rel=0.01)
        assert rb["measured_peak_memory_bytes"] == pytest.approx(ra["measured_peak_memory_bytes"], rel=0.05)
        assert len(rb["step_ms"]) == len(ra["step_ms"]) == len(ra["losses"]) == len(rb["losses"])
        assert ra["losses"] == rb["losses"], r  # a step without a loss is null in report.json on both
