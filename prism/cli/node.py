"""``prism node``: one node's part of a multi-node run without a scheduler (docs/slurm.md, "Without
Slurm"): ``--role head`` runs the command with its processes placed on the agents that join it;
``--role sandbox`` / ``--role assistant`` runs an agent that joins the head. The token comes from
PRISM_TOKEN. ``prism slurm-task`` is the same, with the role read from Slurm's environment."""

from __future__ import annotations

import argparse
import logging
import os

from prism.core.errors import PrismError
from prism.core.hosts import use_process_host
from prism.rpc.agents import AgentPool, run_agent

HELP = "run one node's part of a multi-node run (head or agent), without Slurm"
COMMANDS = ("collect", "calibrate", "emulate")

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, choices=("head", "sandbox", "assistant"))
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                   help="the head's address: where the head listens (all interfaces, this port) and agents dial")
    p.add_argument("--index", type=int, default=0, help="agent index: the slot (sandbox) or replayer host (assistant)")
    p.add_argument("--name", default="", help="this node's name in messages (default: the host name)")
    p.add_argument("--sandbox-agents", type=int, default=1, help="head: sandbox agents to wait for")
    p.add_argument("--assistant-agents", type=int, default=0, help="head: assistant agents to wait for")
    p.add_argument("node_command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help="head: the command and its arguments (collect, calibrate or emulate)")


def env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise PrismError(f"{name}: {os.environ[name]!r} is not a number of seconds") from None


def token_from_env() -> str:
    token = os.environ.get("PRISM_TOKEN", "")
    if not token:
        raise PrismError("PRISM_TOKEN: not set; every node of the run needs the run's token "
                         "(`prism <command> --launcher slurm` sets it)")
    return token


def serve_agent(address: str, *, role: str, index: int, node: str, task: int = -1) -> int:
    reason = run_agent(address, token_from_env(), role=role, index=index, node=node, task=task,
                       join_timeout_s=env_seconds("PRISM_JOIN_TIMEOUT_S", 300.0),
                       lost_after_s=env_seconds("PRISM_LOST_AFTER_S", 10.0))
    log.info("%s agent %d on %s: %s", role, index, node, reason)
    return 0


def serve_head(address: str, command: list[str], agents: dict[str, int], *, node: str) -> int:
    if not command or command[0] not in COMMANDS:
        raise PrismError(f"head: the command must be one of {', '.join(COMMANDS)} (got {' '.join(command) or 'none'})")
    from .main import build_parser  # the command's own parser; main imports this module

    inner = build_parser().parse_args(command)
    host, port = address.rsplit(":", 1)
    pool = AgentPool(bind=f"0.0.0.0:{port}", token=token_from_env(), reachable_host=host,
                     lost_after_s=env_seconds("PRISM_LOST_AFTER_S", 10.0))
    reason = "the run failed"
    try:
        pool.wait_for_agents(agents, env_seconds("PRISM_JOIN_TIMEOUT_S", 300.0))
        log.info("head on %s: agents %s", node, pool.agents())
        with use_process_host(pool):
            code = int(inner.handler(inner) or 0)
        reason = f"prism {command[0]} finished (exit code {code})"
        return code
    finally:
        pool.close(reason)


def run(args: argparse.Namespace) -> int:
    node = args.name or os.uname().nodename
    if args.role == "head":
        return serve_head(args.coordinator, list(args.node_command),
                          {"sandbox": args.sandbox_agents, "assistant": args.assistant_agents}, node=node)
    if args.node_command:
        raise PrismError(f"--role {args.role}: an agent takes no command (got {' '.join(args.node_command)})")
    return serve_agent(args.coordinator, role=args.role, index=args.index, node=node)
