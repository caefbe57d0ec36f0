"""``--launcher slurm``: print (or with ``--submit`` submit) the sbatch line that runs a command across
nodes with deploy/slurm/<command>.sbatch (docs/slurm.md)."""

from __future__ import annotations

import argparse
import logging
import secrets
import shlex
import subprocess
from pathlib import Path

from prism.core.errors import PrismError

from . import non_negative_int, positive_int

__all__ = ["COMMANDS", "add_arguments", "sbatch_argv", "run"]

COMMANDS = ("collect", "calibrate", "emulate")
SBATCH_DIR = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
# Options of ours that the job's own command line must not repeat (it would submit again).
_OURS = {"--launcher": 1, "--submit": 0, "--nodes": 1, "--sandbox-nodes": 1, "--tasks-per-node": 1,
         "--partition": 1, "--gpus-per-node": 1, "--sbatch-arg": 1}

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-node (docs/slurm.md)")
    g.add_argument("--launcher", choices=("local", "slurm"), default="local",
                   help="slurm: print the sbatch line that runs this command across nodes (with --submit: submit it)")
    g.add_argument("--submit", action="store_true", help="with --launcher slurm: submit with sbatch, print the job id")
    g.add_argument("--nodes", type=positive_int, default=3, help="nodes: 1 head + sandbox nodes + assistant nodes (default 3)")
    g.add_argument("--sandbox-nodes", type=positive_int, default=1, help="nodes that run rank workers (default 1)")
    g.add_argument("--tasks-per-node", type=positive_int, default=2,
                   help="Slurm tasks per node: slots per sandbox node, replayer hosts per assistant node (default 2)")
    g.add_argument("--partition", default="", help="Slurm partition (default: the cluster's default)")
    g.add_argument("--gpus-per-node", type=non_negative_int, default=0, help="GPUs per node to request (0: none)")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG", help="an extra sbatch option (repeatable)")


def _command_args(argv: list[str], command: str) -> list[str]:
    """``argv`` from the command on, without the launcher's own options."""
    rest = argv[argv.index(command) + 1:]
    out, i = [], 0
    while i < len(rest):
        name = rest[i].split("=", 1)[0]
        if name in _OURS:
            i += 1 + (_OURS[name] if "=" not in rest[i] else 0)
            continue
        out.append(rest[i])
        i += 1
    return out


def sbatch_argv(args: argparse.Namespace, argv: list[str], *, token: str) -> list[str]:
    if not 1 <= args.sandbox_nodes < args.nodes:
        raise PrismError(f"--sandbox-nodes: {args.sandbox_nodes} does not fit --nodes {args.nodes} "
                         f"(node 0 runs the head; 1..{args.nodes - 1} sandbox nodes)")
    script = SBATCH_DIR / f"{args.command}.sbatch"
    line = ["sbatch", f"--nodes={args.nodes}", f"--ntasks-per-node={args.tasks_per_node}",
            f"--export=ALL,PRISM_TOKEN={token},PRISM_SANDBOX_NODES={args.sandbox_nodes}"]
    if args.partition:
        line.append(f"--partition={args.partition}")
    if args.gpus_per_node:
        line.append(f"--gpus-per-node={args.gpus_per_node}")
    line += args.sbatch_arg
    # Relative paths resolve on the nodes from the submission directory (sbatch's default).
    return [*line, str(script), *_command_args(argv, args.command)]


def run(args: argparse.Namespace, argv: list[str]) -> int:
    line = sbatch_argv(args, argv, token=secrets.token_urlsafe(24))
    if not args.submit:
        print(shlex.join(line))
        return 0
    try:
        out = subprocess.run([line[0], "--parsable", *line[1:]], capture_output=True, text=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise PrismError(f"--submit: sbatch could not run: {e}") from None
    if out.returncode != 0:
        raise PrismError(f"--submit: sbatch failed (exit code {out.returncode}): {out.stderr.strip()}")
    print(out.stdout.strip().split(";")[0])
    return 0
