"""A Slurm task's place in a multi-node run, from the environment srun gives it (docs/slurm.md).

Node 0 of the allocation runs the head (the command and its coordinator); the next
``sandbox_nodes`` nodes run one sandbox agent per task (rank workers: slot = the task's index
among them, device = SLURM_LOCALID); the remaining nodes run assistant agents (replayers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import PrismError

__all__ = ["SlurmEnvError", "SlurmTask", "TaskRole", "agent_counts", "task_role", "default_port"]


class SlurmEnvError(PrismError):
    """The Slurm environment is missing or inconsistent (not run under srun?)."""


@dataclass(frozen=True, slots=True)
class SlurmTask:
    job_id: int
    proc_id: int
    local_id: int
    node_id: int
    num_nodes: int
    num_tasks: int
    node_name: str
    node_list: str

    @property
    def tasks_per_node(self) -> int:
        return self.num_tasks // self.num_nodes

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlurmTask:
        env = os.environ if env is None else env
        names = {"job_id": "SLURM_JOB_ID", "proc_id": "SLURM_PROCID", "local_id": "SLURM_LOCALID",
                 "node_id": "SLURM_NODEID", "num_nodes": "SLURM_NNODES", "num_tasks": "SLURM_NTASKS"}
        missing = [v for v in (*names.values(), "SLURMD_NODENAME") if v not in env]
        if missing:
            raise SlurmEnvError(f"slurm: {', '.join(missing)} not set; run this under srun inside an allocation")
        try:
            values = {k: int(env[v]) for k, v in names.items()}
        except ValueError as e:
            raise SlurmEnvError(f"slurm: a task variable is not an integer: {e}") from None
        task = cls(**values, node_name=env["SLURMD_NODENAME"], node_list=env.get("SLURM_JOB_NODELIST", ""))
        if task.num_tasks % task.num_nodes:
            raise SlurmEnvError(f"slurm: {task.num_tasks} tasks on {task.num_nodes} nodes; use --ntasks-per-node "
                                "so every node runs as many tasks")
        return task


@dataclass(frozen=True, slots=True)
class TaskRole:
    role: str
    """"head", "idle" (node 0's other tasks), "sandbox" or "assistant"."""
    index: int
    """Slot (sandbox) or assistant index; 0 for the head."""


def task_role(task: SlurmTask, sandbox_nodes: int) -> TaskRole:
    if not 1 <= sandbox_nodes < task.num_nodes:
        raise SlurmEnvError(f"PRISM_SANDBOX_NODES: {sandbox_nodes} sandbox nodes do not fit an allocation of "
                            f"{task.num_nodes} nodes (node 0 runs the head; needs 1..{task.num_nodes - 1})")
    tpn = task.tasks_per_node
    if task.node_id == 0:
        return TaskRole("head" if task.local_id == 0 else "idle", 0)
    if task.node_id <= sandbox_nodes:
        return TaskRole("sandbox", (task.node_id - 1) * tpn + task.local_id)
    return TaskRole("assistant", (task.node_id - 1 - sandbox_nodes) * tpn + task.local_id)


def agent_counts(task: SlurmTask, sandbox_nodes: int) -> dict[str, int]:
    tpn = task.tasks_per_node
    return {"sandbox": sandbox_nodes * tpn, "assistant": (task.num_nodes - 1 - sandbox_nodes) * tpn}


def default_port(job_id: int) -> int:
    """The head's port when PRISM_PORT is not set: one per job, so that jobs sharing a node differ."""
    return 20000 + job_id % 20000
