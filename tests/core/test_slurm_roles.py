"""A Slurm task's role from srun's environment, and the sbatch line of --launcher slurm."""

import pytest

from prism.cli.launcher import SBATCH_DIR, sbatch_argv
from prism.cli.main import build_parser
from prism.core.errors import PrismError
from prism.core.slurm import SlurmTask, TaskRole, agent_counts, task_role


def env(proc, local, node, nodes=4, tasks=8):
    return {"SLURM_JOB_ID": "42", "SLURM_PROCID": str(proc), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
            "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(tasks), "SLURMD_NODENAME": f"n{node + 1}",
            "SLURM_JOB_NODELIST": "n[1-4]"}


def test_node_0_is_the_head_then_sandbox_slots_then_assistants():
    roles = [task_role(SlurmTask.from_env(env(p, p % 2, p // 2)), sandbox_nodes=2) for p in range(8)]
    assert roles == [TaskRole("head", 0), TaskRole("idle", 0),
                     TaskRole("sandbox", 0), TaskRole("sandbox", 1), TaskRole("sandbox", 2), TaskRole("sandbox", 3),
                     TaskRole("assistant", 0), TaskRole("assistant", 1)]
    assert agent_counts(SlurmTask.from_env(env(0, 0, 0)), 2) == {"sandbox": 4, "assistant": 2}


def test_bad_slurm_environments_name_the_variable():
    with pytest.raises(PrismError, match="SLURM_PROCID"):
        SlurmTask.from_env({k: v for k, v in env(0, 0, 0).items() if k != "SLURM_PROCID"})
    with pytest.raises(PrismError, match="--ntasks-per-node"):
        SlurmTask.from_env(env(0, 0, 0, nodes=3, tasks=8))
    with pytest.raises(PrismError, match="PRISM_SANDBOX_NODES"):
        task_role(SlurmTask.from_env(env(0, 0, 0)), sandbox_nodes=4)


def test_the_sbatch_line_carries_the_knobs_and_the_commands_own_arguments():
    argv = ["-v", "emulate", "RUN", "--ranks", "0,1", "--launcher", "slurm", "--nodes", "5", "--sandbox-nodes=2",
            "--tasks-per-node", "4", "--partition", "gpu", "--sbatch-arg=--time=30", "--steps", "3"]
    args = build_parser().parse_args(argv)
    line = sbatch_argv(args, argv, token="T0K")
    assert line == ["sbatch", "--nodes=5", "--ntasks-per-node=4", "--export=ALL,PRISM_TOKEN=T0K,PRISM_SANDBOX_NODES=2",
                    "--partition=gpu", "--time=30", str(SBATCH_DIR / "emulate.sbatch"),
                    "RUN", "--ranks", "0,1", "--steps", "3"]
    assert (SBATCH_DIR / "emulate.sbatch").is_file()
    with pytest.raises(PrismError, match="--sandbox-nodes"):
        sbatch_argv(build_parser().parse_args(["collect", "--job", "j", "--out", "o", "--nodes", "2",
                                               "--sandbox-nodes", "2"]), [], token="T")
