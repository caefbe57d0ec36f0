"""Write a run's graph as a Chrome/Perfetto trace (open it in ui.perfetto.dev or chrome://tracing):
one process per rank, a compute lane and one comm lane per process group."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from prism.core.errors import RunDirError
from prism.core.rundir import RunDir
from prism.graph.export import to_chrome_trace, write_chrome_trace
from prism.graph.io import read_graph
from prism.graph.simulate import simulate

HELP = "export a run's graph as a Chrome/Perfetto trace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory")
    p.add_argument("--graph", default="real", help="real, bare or timed (default: real)")
    p.add_argument("--simulated", action="store_true", help="use prism simulate's predicted times")
    p.add_argument("--out", required=True, help="trace file to write (.json)")


def run(args: argparse.Namespace) -> int:
    directory = RunDir(Path(args.run)).graph_dir(args.graph)
    if not (directory / "manifest.pb").exists():
        raise RunDirError(f"{args.run}: no {args.graph} graph ({directory})")
    graph = read_graph(directory)
    sim = simulate(graph) if args.simulated else None
    write_chrome_trace(args.out, to_chrome_trace(graph, sim, label=" (simulated)" if sim else ""))
    Console().print(f"wrote {args.out}: {sum(len(n) for n in graph.nodes.values())} nodes of {len(graph.nodes)} ranks")
    return 0
