"""Step-time gap verdicts (GapScope) of a run or an emulation: per step, a feasible lower bound
T_lb from the measured work and the parallelism's dependency rules, the binding chain that pins
it, and the step's idle time split into recoverable classes (R1 late launch, R2 queue
serialization, R3 cross-rank skew) and hard ones (H1 structural orphan such as the pipeline
bubble, H2 comm the step's independent work cannot hide). Writes analysis.json and a Gantt
chart per step (docs/analyze.md)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.analysis import CLASS_NAMES, CLASSES, RECOVERABLE, GapReport, analyze_graph
from prism.analysis.gantt import write_gantt
from prism.core.atomic import atomic_write_text
from prism.core.errors import RunDirError
from prism.core.rundir import RunDir
from prism.core.strict_json import dumps_strict
from prism.graph.io import read_graph
from prism.graph.records import Graph
from prism.graph.templates import dp_permutations
from prism.vrank_replayer.emulate_report import REPORT_FILE, load_emulation

from . import non_negative_int

log = logging.getLogger(__name__)

HELP = "per-step lower bound, gap verdicts and Gantt charts of a run or an emulation"

MAX_GANTT_STEPS = 8
MAX_CHAIN_LINKS = 12


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="RUN|EMULATION", help="run directory, or an emulation directory (RUN/emulations/<id>)")
    p.add_argument("--graph", default=None, help="which graph of a run: real, timed or bare (default: real, else timed)")
    p.add_argument("--skip", type=non_negative_int, default=None, help="warmup steps left out (default: the job's iterations.warmup)")
    p.add_argument("--out", default=None, help="output directory (default: RUN/analysis or EMULATION/analysis)")
    p.add_argument("--json", action="store_true", help="print analysis.json")


@dataclass(frozen=True, slots=True)
class Analysis:
    report: GapReport
    graph: Graph
    out_dir: Path
    gantts: tuple[Path, ...]
    source: str


def _peers(run: RunDir, world: int) -> dict[int, tuple[int, ...]] | None:
    """Each rank's DP replicas from the job's parallelism (None: none declared; then ranks that
    run the same program stand in, which would pair the middle stages of a pipeline)."""
    if not run.job_file.exists():
        return None
    p = run.load_job().parallelism
    if p is None or p.product != world:
        return None
    if p.dp < 2:
        return {r: (r,) for r in range(world)}
    perms = dp_permutations({"pp": p.pp, "dp": p.dp, "cp": p.cp, "tp": p.tp}, p.mesh)
    return {r: tuple(sorted({perm[r] for perm in perms})) for r in range(world)}


def analyze_target(target: str | Path, *, graph_kind: str | None = None, skip: int | None = None,
                   out_dir: str | Path | None = None) -> Analysis:
    """Load a run's graph or an emulation, analyze every step after the warmup, write
    analysis.json and the Gantt charts."""
    target = Path(target)
    if (target / REPORT_FILE).is_file():
        graph = load_emulation(target)
        run = RunDir(target.parent.parent)
        source = f"emulation {target.name}"
        if len(graph.nodes) < graph.world_size:
            log.warning("%s ran its virtual ranks as soon as they could (no timed graph): only the sandbox "
                        "ranks %s are analyzed, and their waits on virtual ranks count as late launches (R1); "
                        "run prism calibrate first", target, sorted(graph.nodes))
    else:
        run = RunDir(target)
        kinds = [graph_kind] if graph_kind else ["real", "timed"]
        for kind in kinds:
            if (run.graph_dir(kind) / "manifest.pb").is_file():
                break
        else:
            raise RunDirError(f"{target}: neither an emulation directory ({REPORT_FILE}) nor a run with a "
                              f"{' or '.join(kinds)} graph under graph/")
        graph = read_graph(run.graph_dir(kind))
        source = f"{kind} graph"
    if skip is None:
        skip = run.load_job().iterations.warmup if run.job_file.exists() else 1
    report = analyze_graph(graph, peers=_peers(run, graph.world_size), skip_steps=skip)
    if not report.steps:
        raise RunDirError(f"{target}: no step after the first {skip} has observed times to analyze")
    out = Path(out_dir) if out_dir else target / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    data = {"source": source, "skip_steps": skip, **report.to_json()}
    atomic_write_text(out / "analysis.json", dumps_strict(data, indent=1))
    gantts = tuple(write_gantt(graph, s.step, out / f"gantt-step{s.step}.png", t_lb_ns=s.lower_bound_ns,
                               highlight=frozenset(s.chain_nodes),
                               title=f"{graph.job_name or source} step {s.step}: observed {s.observed_ns / 1e6:.1f} ms, "
                                     f"T_lb {s.lower_bound_ns / 1e6:.1f} ms, {s.verdict} {CLASS_NAMES[s.verdict]}")
                   for s in report.steps[:MAX_GANTT_STEPS])
    return Analysis(report, graph, out, gantts, source)


def _chain_text(links) -> str:
    parts = [str(link) for link in links]
    if len(parts) > MAX_CHAIN_LINKS:
        half = MAX_CHAIN_LINKS // 2
        parts = parts[:half] + [f"… {len(parts) - 2 * half} more …"] + parts[-half:]
    return " → ".join(parts)


def print_analysis(a: Analysis, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 100))
    table = Table(title=f"gap verdicts ({a.source}; ms; R = recoverable, H = hard)", title_justify="left")
    for col in ("step", "observed", "T_lb", "gap", *CLASSES, "verdict"):
        table.add_column(col, justify="left" if col == "verdict" else "right", no_wrap=True)
    for s in a.report.steps:
        table.add_row(str(s.step), f"{s.observed_ns / 1e6:.2f}", f"{s.lower_bound_ns / 1e6:.2f}", f"{s.gap_ns / 1e6:.2f}",
                      *(f"{s.classes_ns[c] / 1e6:.2f}" for c in CLASSES), s.verdict)
    console.print(table)
    v = a.report.verdict
    mean = a.report.mean_classes_ns()
    observed = a.report.mean_ns("observed_ns")
    kind = "recoverable" if v in RECOVERABLE else "hard (not recoverable)"
    console.print(f"verdict: [bold]{v} {CLASS_NAMES[v]}[/], {kind}: {mean[v] / 1e6:.2f} ms of a "
                  f"{observed / 1e6:.2f} ms step ({mean[v] / observed * 100 if observed else 0:.0f} %); "
                  f"T_lb {a.report.mean_ns('lower_bound_ns') / 1e6:.2f} ms", highlight=False, soft_wrap=True)
    hard = a.report.largest_hard
    console.print("recoverable " + ", ".join(f"{c} {mean[c] / 1e6:.2f} ms" for c in ("R1", "R2", "R3"))
                  + "; hard " + ", ".join(f"{c} {mean[c] / 1e6:.2f} ms" for c in ("H1", "H2"))
                  + f"; largest hard class: {hard} {CLASS_NAMES[hard]}", highlight=False, soft_wrap=True)
    for s in a.report.steps:
        console.print(f"binding chain, step {s.step} (T_lb {s.lower_bound_ns / 1e6:.2f} ms, ends on rank {s.binding_rank}): "
                      f"{_chain_text(s.chain)}", highlight=False, soft_wrap=True)
    console.print(f"outputs: {a.out_dir} (analysis.json, {len(a.gantts)} Gantt chart(s))", highlight=False,
                  soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    a = analyze_target(args.target, graph_kind=args.graph, skip=args.skip, out_dir=args.out)
    if args.json:
        print((a.out_dir / "analysis.json").read_text())
        return 0
    print_analysis(a)
    return 0
