"""Write a run's graph, or an emulation, as a Chrome/Perfetto trace (open it in ui.perfetto.dev or
chrome://tracing: one process per rank, a compute lane and one lane per comm stream, flow arrows
from each send to its receive and between the members of each collective), and/or as Chakra
execution traces (one ``<prefix>.<rank>.et`` per rank, for ASTRA-sim)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from prism.core.errors import PrismError, RunDirError
from prism.core.rundir import RunDir
from prism.graph.chakra import write_chakra
from prism.graph.export import to_chrome_trace, write_chrome_trace
from prism.graph.io import read_graph
from prism.graph.simulate import simulate
from prism.vrank_replayer.emulate_report import REPORT_FILE, load_emulation

HELP = "export a run's graph or an emulation as a Chrome/Perfetto trace or Chakra ET"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN|EMULATION", help="run directory, or an emulation directory (RUN/emulations/<id>)")
    p.add_argument("--graph", default="real", help="which graph of a run: real, bare or timed (default: real)")
    p.add_argument("--simulated", action="store_true", help="use prism simulate's predicted times")
    p.add_argument("--out", default=None, help="Chrome trace file to write (.json)")
    p.add_argument("--chakra", default=None, metavar="DIR", help="also write Chakra ET files, one per rank, into DIR")
    p.add_argument("--chakra-prefix", default="prism", help="Chakra file names: PREFIX.<rank>.et (default: prism)")


def run(args: argparse.Namespace) -> int:
    if not args.out and not args.chakra:
        raise PrismError("prism export: give --out TRACE.json, --chakra DIR, or both")
    if args.out and not Path(args.out).resolve().parent.is_dir():  # before the graph is read
        raise PrismError(f"--out: {Path(args.out).resolve().parent} is not a directory")
    source = Path(args.run)
    if (source / REPORT_FILE).is_file():
        graph = load_emulation(source)
    else:
        directory = RunDir(source).graph_dir(args.graph)
        if not (directory / "manifest.pb").exists():
            raise RunDirError(f"{args.run}: no {args.graph} graph ({directory}) and no emulation ({REPORT_FILE})")
        graph = read_graph(directory)
    sim = simulate(graph) if args.simulated else None
    console = Console()
    count = f"{sum(len(n) for n in graph.nodes.values())} nodes of {len(graph.nodes)} ranks"
    if args.out:
        try:
            write_chrome_trace(args.out, to_chrome_trace(graph, sim, label=" (simulated)" if sim else ""))
        except OSError as e:
            raise PrismError(f"--out: cannot write {args.out}: {e.strerror or e}") from None
        console.print(f"wrote {args.out}: {count}", highlight=False)
    if args.chakra:
        try:
            Path(args.chakra).mkdir(parents=True, exist_ok=True)
            paths = write_chakra(graph, args.chakra, args.chakra_prefix)
        except OSError as e:
            raise PrismError(f"--chakra: cannot write into {args.chakra}: {e.strerror or e}") from None
        console.print(f"wrote {len(paths)} Chakra ET file(s) into {args.chakra}: {count}", highlight=False)
    return 0
