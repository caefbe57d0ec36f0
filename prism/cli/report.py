"""Rich tables for the terminal."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from prism.core.host_speed import DRIFT_WARN, spread
from prism.graph.records import Graph, NodeKind
from prism.graph.steps import no_steps_message

__all__ = ["print_run_table", "human_bytes", "ranks_without_steps", "print_no_steps", "print_host_speed",
           "print_tracked_recording", "print_tracked_sandbox"]


def ranks_without_steps(graph: Graph) -> list[int]:
    """Ranks whose iteration boundaries were not found (no step times)."""
    return [r for r in sorted(graph.nodes) if not (s := graph.summaries.get(r)) or not s.step_times_ns]


def print_no_steps(ranks, console: Console | None = None) -> None:
    """The one line that says which ranks have no steps and how to give them some."""
    if ranks:
        (console or Console()).print(f"[yellow]{no_steps_message(list(ranks))}[/]", soft_wrap=True)


def print_host_speed(phases: Sequence[tuple[str, Sequence[float]]], console: Console) -> None:
    """One line on the host's speed (prism.core.host_speed) in each phase of a timing command, e.g.
    ``[("at the real run", [8.66]), ("during the calibration", [7.23, 8.70])]``, and how far apart all
    the probes lie; a warning above ``DRIFT_WARN``: the times compared moved with the host."""
    phases = [(name, list(p)) for name, p in phases if p]
    if not phases:
        return
    every = [x for _, p in phases for x in p]
    parts = [f"{p[0]:.2f} ms {name}" if len(p) == 1 else f"{min(p):.2f}–{max(p):.2f} ms {name}" for name, p in phases]
    line = f"host speed: probe {', '.join(parts)} ({spread(every) * 100:.0f} % apart)"
    if spread(every) > DRIFT_WARN:
        console.print(f"[bold yellow]warning:[/] {line}: the host's speed moved, and the times measured in these "
                      f"phases moved with it", highlight=False)
    else:
        console.print(line, highlight=False)


def print_tracked_recording(console: Console) -> None:
    """The warning for a real run whose steps were timed with the CPU memory tracker running."""
    console.print("[bold yellow]warning:[/] the real run was recorded with the CPU memory tracker in its timed "
                  "steps (--no-memory-pass): its step times include the tracker's cost per op (~5-10 µs per aten "
                  "op), which calibration and emulation do not pay, so the error against it is not prism's; "
                  "record the job again without --no-memory-pass to compare times", highlight=False)


def print_tracked_sandbox(console: Console) -> None:
    """The warning for an emulation whose sandbox ranks were timed with the CPU memory tracker."""
    console.print("[bold yellow]warning:[/] the sandbox ranks ran with the CPU memory tracker in their timed steps "
                  "(--no-memory-pass): their step times include its cost per op (~5-10 µs per aten op), the "
                  "vranks' calibrated times do not; emulate without --no-memory-pass to time them untracked",
                  highlight=False)


def human_bytes(n: float) -> str:
    if n < 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


_ABBREV = {
    "all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A", "broadcast": "BC",
    "reduce": "RD", "gather": "GA", "scatter": "SC", "barrier": "BAR", "send": "SEND", "recv": "RECV",
}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f}"


def print_run_table(graph: Graph, *, title: str, skip_steps: int = 1, console: Console | None = None) -> None:
    """Per rank: comm ops by kind, bytes sent, step time (after ``skip_steps`` warmup), peak memory (over
    the measured steps, and over the whole run), loss."""
    console = console or Console(width=max(Console().width, 120))
    table = Table(title=title, title_justify="left", caption="AR all_reduce, AG all_gather, RS reduce_scatter, "
                  "A2A all_to_all, BC broadcast, RD reduce, GA gather, SC scatter, BAR barrier", caption_justify="left")
    for col, justify in [("rank", "right"), ("comm ops", "left"), ("bytes", "right"),
                         ("step ms (mean)", "right"), ("steps", "right"), ("peak mem (measured / run)", "right"),
                         ("last loss", "right")]:
        table.add_column(col, justify=justify)
    for rank in sorted(graph.nodes):
        nodes = graph.nodes[rank]
        kinds = Counter(n.op.value if n.op else n.kind.value for n in nodes if n.is_comm)
        ops = " ".join(f"{_ABBREV.get(k, k)}:{v}" for k, v in sorted(kinds.items()))
        sent = sum(n.size_bytes for n in nodes if n.is_comm and n.kind is not NodeKind.RECV)
        s = graph.summaries.get(rank)
        steps = list(s.step_times_ns) if s else []
        measured = steps[skip_steps:] or steps
        mean = _ms(statistics.fmean(measured)) if measured else "-"
        loss = f"{s.losses[-1]:.4g}" if s and s.losses and not math.isnan(s.losses[-1]) else "-"
        mem = f"{human_bytes(s.measured_peak_memory_bytes)} / {human_bytes(s.peak_memory_bytes)}" if s else "-"
        table.add_row(str(rank), ops, human_bytes(sent), mean, str(len(steps)), mem, loss)
    console.print(table)
    print_no_steps(ranks_without_steps(graph), console)
