"""One Slurm task of a multi-node run (what deploy/slurm/*.sbatch run under srun; docs/slurm.md).

Node 0's first task is the head: it serves the agents, waits until all have joined, then runs the
command as on one host, its processes placed on the agents. Tasks on the sandbox nodes run rank
workers, tasks on the other nodes run replayers (``prism node`` does the work). Knobs come from
the environment: PRISM_TOKEN (required), PRISM_COORDINATOR (host:port of the head; default the
first node's NodeAddr and PRISM_PORT), PRISM_SANDBOX_NODES (1), PRISM_LOST_AFTER_S (10),
PRISM_JOIN_TIMEOUT_S (300).
"""

from __future__ import annotations

import argparse
import os
import subprocess

from prism.core.errors import PrismError
from prism.core.slurm import SlurmTask, agent_counts, default_port, task_role

from .node import COMMANDS, serve_agent, serve_head, token_from_env

HELP = "run one Slurm task of a multi-node run (used by deploy/slurm/*.sbatch)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_command", choices=COMMANDS, metavar="COMMAND", help=" | ".join(COMMANDS))
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="the command's arguments")


def _scontrol(*argv: str) -> str:
    try:
        return subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise PrismError(f"PRISM_COORDINATOR is not set and `scontrol {' '.join(argv)}` failed: {e}") from None


def head_address(task: SlurmTask) -> str:
    """PRISM_COORDINATOR, else node 0's NodeAddr (the address Slurm itself uses for it) and PRISM_PORT."""
    explicit = os.environ.get("PRISM_COORDINATOR", "")
    if explicit:
        return explicit
    port = int(os.environ.get("PRISM_PORT") or default_port(task.job_id))
    first = _scontrol("show", "hostnames", task.node_list).split()[0]
    addr = next((f.split("=", 1)[1] for f in _scontrol("show", "node", "-o", first).split()
                 if f.startswith("NodeAddr=")), first)
    return f"{addr}:{port}"


def run(args: argparse.Namespace) -> int:
    token_from_env()  # before anything else: a task without it can do nothing
    task = SlurmTask.from_env()
    sandbox_nodes = int(os.environ.get("PRISM_SANDBOX_NODES", "1"))
    role = task_role(task, sandbox_nodes)
    if role.role == "idle":
        return 0
    address = head_address(task)
    if role.role == "head":
        return serve_head(address, [args.task_command, *args.command_args], agent_counts(task, sandbox_nodes),
                          node=task.node_name)
    return serve_agent(address, role=role.role, index=role.index, node=task.node_name, task=task.proc_id)
