"""One Slurm task of a multi-node run (what deploy/slurm/*.sbatch run under srun; docs/slurm.md).

Node 0's first task is the head: it serves the agents, waits until all have joined, then runs the
command as on one host, its processes placed on the agents. Tasks on the sandbox nodes run rank
workers, tasks on the other nodes run replayers. Knobs come from the environment: PRISM_TOKEN
(required), PRISM_COORDINATOR (host:port of the head; default the first node's NodeAddr and
PRISM_PORT), PRISM_SANDBOX_NODES (1), PRISM_LOST_AFTER_S (10), PRISM_JOIN_TIMEOUT_S (300).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess

from prism.core.errors import PrismError
from prism.core.hosts import use_process_host
from prism.core.slurm import SlurmTask, agent_counts, default_port, task_role
from prism.rpc.agents import AgentPool, run_agent

HELP = "run one Slurm task of a multi-node run (used by deploy/slurm/*.sbatch)"
COMMANDS = ("collect", "calibrate", "emulate")

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_command", choices=COMMANDS, metavar="COMMAND", help=" | ".join(COMMANDS))
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="the command's arguments")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise PrismError(f"{name}: {os.environ[name]!r} is not a number of seconds") from None


def _node_addr(node: str) -> str:
    """The address Slurm itself uses for ``node`` (its NodeAddr)."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise PrismError(f"PRISM_COORDINATOR is not set and `scontrol show node {node}` failed: {e}") from None
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


def _first_node(node_list: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise PrismError(f"PRISM_COORDINATOR is not set and `scontrol show hostnames` failed: {e}") from None
    return out.split()[0]


def head_address(task: SlurmTask) -> str:
    explicit = os.environ.get("PRISM_COORDINATOR", "")
    if explicit:
        return explicit
    port = int(os.environ.get("PRISM_PORT") or default_port(task.job_id))
    return f"{_node_addr(_first_node(task.node_list))}:{port}"


def run(args: argparse.Namespace) -> int:
    token = os.environ.get("PRISM_TOKEN", "")
    if not token:
        raise PrismError("PRISM_TOKEN: not set; every task of the run needs the run's token "
                         "(`prism <command> --launcher slurm` sets it)")
    task = SlurmTask.from_env()
    sandbox_nodes = int(os.environ.get("PRISM_SANDBOX_NODES", "1"))
    role = task_role(task, sandbox_nodes)
    address = head_address(task)
    lost_after_s = _env_float("PRISM_LOST_AFTER_S", 10.0)
    if role.role == "idle":
        return 0
    if role.role != "head":
        reason = run_agent(address, token, role=role.role, index=role.index, node=task.node_name,
                           task=task.proc_id, join_timeout_s=_env_float("PRISM_JOIN_TIMEOUT_S", 300.0),
                           lost_after_s=lost_after_s)
        log.info("%s agent %d on %s: %s", role.role, role.index, task.node_name, reason)
        return 0
    from .main import build_parser  # the command's own parser; main imports this module

    inner = build_parser().parse_args([args.task_command, *args.command_args])
    host, port = address.rsplit(":", 1)
    pool = AgentPool(bind=f"0.0.0.0:{port}", token=token, reachable_host=host, lost_after_s=lost_after_s)
    reason = "the run failed"
    try:
        pool.wait_for_agents(agent_counts(task, sandbox_nodes), _env_float("PRISM_JOIN_TIMEOUT_S", 300.0))
        log.info("head on %s: agents %s", task.node_name, pool.agents())
        with use_process_host(pool):
            code = int(inner.handler(inner) or 0)
        reason = f"prism {args.task_command} finished (exit code {code})"
        return code
    finally:
        pool.close(reason)
