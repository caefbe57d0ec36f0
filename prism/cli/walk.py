"""Run one logical rank alone with the fake engine and print its communication sequence.

The cheapest look at a rank's distributed path (like PyTorch's fake process group), for programs
whose communication does not depend on received values.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from prism.core.config import load_job
from prism.graph.text import format_node
from prism.sandbox.recording import walk_rank

HELP = "run one rank alone (fake values) and print its op sequence"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job.yaml")
    p.add_argument("--rank", type=int, required=True, help="logical rank to become")
    p.add_argument("--all", action="store_true", help="also print compute, wait and mark nodes")
    p.add_argument("--engine", choices=("fake", "torch-fake"), default="fake",
                   help="fake: prism's filler values; torch-fake: PyTorch's built-in fake process group")


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    record = walk_rank(job, args.rank, engine=args.engine)
    console = Console()
    for node in record.nodes:
        if args.all or node.is_comm:
            console.print(format_node(node), markup=False, highlight=False, soft_wrap=True)
    return 0
