"""What ``prism emulate`` leaves in RUN/emulations/<id>/: ``report.json`` and ``timeline.json``.

report.json, per sandbox rank: iteration time per step, mean and p50 over the measured steps
(after ``skip_steps`` warmup steps), the calibrated prediction of the same steps (the timed
graph), peak memory (over the measured steps and over the whole run), OOM if it happened, diverged ops, losses. timeline.json: a Chrome
trace with the real spans of the sandbox ranks (their recorded nodes, on the launcher's clock)
and the simulated spans of the vranks (the timed graph, shifted so that the sandbox ranks'
predicted end of step 0 meets their real one).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from prism.analysis.gantt import write_gantt
from prism.core.atomic import atomic_write_text
from prism.core.balance import router_summary
from prism.core.errors import RankOOMError, RunDirError
from prism.core.host_speed import parse_probes, probe_ms
from prism.core.rundir import RunDir
from prism.core.strict_json import dumps_strict
from prism.core.whatif import SandboxChange
from prism.core.workerspec import record_path
from prism.graph.export import to_chrome_trace, write_chrome_trace
from prism.graph.io import read_graph
from prism.graph.memory_pass import timed_with_tracker
from prism.graph.records import Graph, GroupInfo, Node, NodeKind

from .calibrate_run import ensure_recorded
from .launch import PROFILE_DIR, EmulateOptions, EmulateResult, emulate, timed_run_tracked
from .replayer import cosim_timeline_path

__all__ = ["EmulationReport", "emulate_and_report", "emulation_graph", "load_emulation", "idle_fraction",
           "summarize_steps", "REPORT_FILE", "TIMELINE_FILE", "GANTT_FILE"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.json"
TIMELINE_FILE = "timeline.json"
GANTT_FILE = "gantt.png"


@dataclass(frozen=True, slots=True)
class EmulationReport:
    out_dir: Path
    data: dict
    """The content of report.json."""
    result: EmulateResult | None
    """None when the emulation stopped on an OOM."""
    nodes: dict[int, tuple[Node, ...]]
    """What each sandbox rank recorded (real times, launcher clock)."""
    groups: dict[str, GroupInfo]


def summarize_steps(steps_ns, skip: int) -> dict:
    """Step times in ms: all of them, and mean / p50 over those after ``skip``."""
    steps_ms = [s / 1e6 for s in steps_ns]
    kept = steps_ms[skip:] or steps_ms
    return {"step_ms": steps_ms, "mean_ms": statistics.fmean(kept) if kept else None,
            "p50_ms": statistics.median(kept) if kept else None, "measured_steps": len(kept)}


def idle_fraction(nodes, step_times_ns, skip: int) -> float | None:
    """The share of the measured steps (after ``skip``) that a rank spent outside its compute
    spans: waiting on its peers (the pipeline bubble, a straggler) and communicating."""
    total = sum(step_times_ns[skip:])
    if total <= 0:
        return None
    busy = sum(n.duration_ns for n in nodes if n.kind is NodeKind.COMPUTE and n.step >= skip
               and n.step < len(step_times_ns) and n.duration_ns > 0)
    return max(0.0, 1.0 - busy / total)


def _vrank_idle(cosim: dict[int, tuple[Node, ...]], skip: int) -> dict[str, float]:
    """Each co-simulated vrank's idle fraction over its steps after ``skip`` (the steps it ended)."""
    out = {}
    for r, ns in sorted(cosim.items()):
        ends = [n.start_ns for n in ns if n.kind is NodeKind.MARK and n.mark == "step_end"]
        steps = [b - a for a, b in zip(ends, ends[1:])]  # the first step's start is start-up
        value = idle_fraction([n for n in ns if n.step >= 1], [0, *steps], max(skip, 1))
        if value is not None:
            out[str(r)] = value
    return out


def _view(row: dict) -> dict:
    """What a comparison shows of one rank: iteration time, idle, peak memory."""
    keys = ("mean_ms", "p50_ms", "idle_fraction", "measured_peak_memory_bytes", "peak_memory_bytes", "oom")
    return {k: row[k] for k in keys if k in row}


def _recorded(run: RunDir, ranks, skip: int, steps: int | None) -> tuple[dict, bool]:
    """The recorded (real) run's view of the sandbox ranks, when RUN/graph/real exists, and whether
    its steps were timed with the CPU memory tracker running (``timed_with_tracker``)."""
    real_dir = run.graph_dir("real")
    if not (real_dir / "manifest.pb").is_file():
        return {}, False
    real = read_graph(real_dir)
    out = {}
    for r in ranks:
        summary = real.summaries.get(r)
        if summary is None:
            continue
        step_ns = tuple(summary.step_times_ns)[:steps]
        row = summarize_steps(step_ns, skip)
        row.update(idle_fraction=idle_fraction(real.nodes.get(r, ()), step_ns, skip),
                   measured_peak_memory_bytes=summary.measured_peak_memory_bytes,
                   peak_memory_bytes=summary.peak_memory_bytes)
        out[str(r)] = _view(row)
    return out, timed_with_tracker(real.meta)


def _router(run: RunDir, out: Path, ranks, world_size: int) -> dict:
    """The MoE mock router's realised balance ratios: the sandbox ranks' own logs, the recorded
    run's (or capture run's) for the vranks, whose tokens the recorded values carry."""
    logs = []
    for r in range(world_size):
        name = f"rank-{r:05d}.moe_router.json"
        where = [out] if r in ranks else [run.logs, run.root / "capture" / "workers"]
        path = next((d / name for d in where if (d / name).is_file()), None)
        if path is not None:
            logs.append(json.loads(path.read_text()))
    return router_summary(logs) if logs else {}


def _record(out: Path, rank: int):
    path = record_path(out, rank)
    if not path.is_file():
        return None
    with path.open("rb") as f:
        return pickle.load(f)  # noqa: S301 - our own worker's output (a RankRecord)


def _step_end_ns(nodes, step: int) -> int | None:
    ends = [n.start_ns for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end"]
    return ends[step] if step < len(ends) and ends[step] >= 0 else None


def _cosim_nodes(timed: Graph, out: Path, origin_ns: int | None) -> dict[int, tuple[Node, ...]]:
    """The vranks' nodes at the times the co-simulation gave them (launcher clock), if it ran."""
    path = cosim_timeline_path(out)
    if origin_ns is None or not path.is_file():
        return {}
    nodes = {}
    for r, rows in json.loads(path.read_text()).items():
        mine = timed.nodes[int(r)]
        nodes[int(r)] = tuple(dataclasses.replace(mine[i], start_ns=issue - origin_ns, duration_ns=end - issue)
                              for i, issue, end in rows if issue >= origin_ns)
    return nodes


def emulation_graph(timed: Graph | None, real_nodes: dict, groups: dict, steps: int | None, world_size: int,
                    cosim: dict | None = None) -> Graph:
    """The emulated run as one graph: the sandbox ranks' recorded nodes (launcher clock) and the
    vranks' nodes — at the co-simulation's times when it ran (``cosim``), else the timed graph's,
    shifted so that the sandbox ranks' predicted end of step 0 meets their real one."""
    nodes = dict(real_nodes)
    if cosim:
        nodes.update({r: ns for r, ns in cosim.items() if r not in real_nodes})
        groups = {**timed.groups, **groups}
    elif timed is not None:
        shifts = [r_end - p_end for r, ns in real_nodes.items()
                  if (r_end := _step_end_ns(ns, 0)) is not None and (p_end := _step_end_ns(timed.nodes[r], 0)) is not None]
        shift = int(statistics.fmean(shifts)) if shifts else 0
        for r, ns in timed.nodes.items():
            if r in real_nodes:
                continue
            nodes[r] = tuple(dataclasses.replace(n, start_ns=n.start_ns + shift) for n in ns
                             if (steps is None or n.step < steps) and n.start_ns >= 0)
        groups = {**timed.groups, **groups}
    return Graph(world_size=world_size, nodes=nodes, groups=groups, kind="emulated", meta={"clock": "shared"})


def load_emulation(out_dir: str | Path) -> Graph:
    """:func:`emulation_graph` of an emulation directory (RUN/emulations/<id>), from its
    report.json, the sandbox ranks' records and the timed graph it ran with."""
    out = Path(out_dir)
    report = out / REPORT_FILE
    if not report.is_file():
        raise RunDirError(f"{out}: not an emulation directory (no {REPORT_FILE})")
    data = json.loads(report.read_text())
    real_nodes, groups, summaries = {}, {}, {}
    for r in data["sandbox_ranks"]:
        rec = _record(out, r)
        if rec is None:
            raise RunDirError(f"{record_path(out, r)}: rank {r}'s record of this emulation is missing")
        real_nodes[r] = tuple(rec.nodes)
        groups.update({g.group_id: g for g in rec.groups})
        summaries[r] = rec.summary
    timed = None
    if data.get("clock") == "timed":
        timed_dir = Path(data.get("timed_graph_dir") or out.parent.parent / "graph" / "timed")
        timed = read_graph(timed_dir)
    graph = emulation_graph(timed, real_nodes, groups, data.get("steps"), data["world_size"])
    return dataclasses.replace(graph, summaries=summaries)


def _timeline(graph: Graph, real_ranks, *, cosim: bool = False) -> dict:
    trace = to_chrome_trace(graph)
    virtual = " (virtual, co-simulated)" if cosim else " (virtual, timed graph)"
    for ev in trace["traceEvents"]:
        if ev.get("name") == "process_name":
            ev["args"]["name"] += " (real)" if ev["pid"] in real_ranks else virtual
    return trace


def _write_gantt(graph: Graph, skip: int, out: Path) -> None:
    """The Gantt chart of the first measured step beside report.json (a failure to draw it is
    logged: the emulation's results stand without it)."""
    steps = [n.step for ns in graph.nodes.values() for n in ns if n.kind is NodeKind.MARK and n.mark == "step_end"]
    if not steps:
        return
    step = min(skip, max(steps))
    try:
        write_gantt(graph, step, out / GANTT_FILE, title=f"emulated step {step}")
    except ImportError as e:
        log.warning("no Gantt chart (%s): install matplotlib", e)


def host_speed(timed: Graph | None) -> dict:
    """The host's speed now (prism.core.host_speed) and, with a timed graph that has them, its
    speed during the calibration and how far apart the two are (+: slower now)."""
    now = probe_ms()
    out: dict = {"host_probe_ms": now}
    calibration = parse_probes(timed.meta.get("host_probe_ms", "")) if timed is not None else ()
    if calibration:
        out["calibration_host_probe_ms"] = list(calibration)
        out["host_speed_vs_calibration"] = now / statistics.median(calibration) - 1
    return out


def emulate_and_report(run_dir: str | Path, options: EmulateOptions, *, use_timed: bool = True,
                       skip_steps: int | None = None, baseline: bool = False) -> EmulationReport:
    """Run :func:`~.launch.emulate` (with the timed graph when RUN/graph/timed exists and
    ``use_timed``) into RUN/emulations/<id>/ and write report.json and timeline.json there.

    A what-if (``options.change``): report.json names the change and, per sandbox rank, shows the
    recorded run's ``recorded`` view beside it; with ``baseline`` the unchanged emulation runs
    first (into ``<id>/baseline/``) and its view is under ``baseline``."""
    run = RunDir(Path(run_dir))
    if baseline:
        ranks = tuple(sorted(set(options.ranks)))
        out = Path(options.out_dir) if options.out_dir else (
            run.root / "emulations" / f"{time.strftime('%Y%m%d-%H%M%S')}-ranks-{'_'.join(map(str, ranks))}")
        base = emulate_and_report(run_dir, dataclasses.replace(options, change=SandboxChange(),
                                                               out_dir=str(out / "baseline")),
                                  use_timed=use_timed, skip_steps=skip_steps)
        report = emulate_and_report(run_dir, dataclasses.replace(options, out_dir=str(out)),
                                    use_timed=use_timed, skip_steps=skip_steps)
        report.data["baseline"] = {r: _view(row) for r, row in base.data["ranks"].items()}
        report.data["baseline_dir"] = str(base.out_dir)
        atomic_write_text(report.out_dir / REPORT_FILE, dumps_strict(report.data, indent=1))
        return report
    job = run.load_job()
    timed_dir = run.graph_dir("timed")
    timed = read_graph(timed_dir) if use_timed and (timed_dir / "manifest.pb").is_file() else None
    if options.timed_graph_dir:
        timed = read_graph(options.timed_graph_dir)
    ranks = tuple(sorted(set(options.ranks)))
    out = Path(options.out_dir) if options.out_dir else (
        run.root / "emulations" / f"{time.strftime('%Y%m%d-%H%M%S')}-ranks-{'_'.join(map(str, ranks))}")
    options = dataclasses.replace(options, out_dir=str(out),
                                  timed_graph_dir=options.timed_graph_dir or (str(timed_dir) if timed else ""))
    skip = job.iterations.warmup if skip_steps is None else skip_steps
    cap = job.memory_cap_bytes if options.memory_cap_bytes is None else options.memory_cap_bytes
    data: dict = {"world_size": job.world_size, "sandbox_ranks": list(ranks), "skip_steps": skip,
                  "clock": "timed" if timed is not None else "asap", "steps": options.steps,
                  "memory_cap_bytes": cap, "ranks": {}, "timed_graph_dir": options.timed_graph_dir}
    if not options.change.is_empty:
        data["change"] = options.change.describe()
    if options.profile:
        data["profile_dir"] = str(out / PROFILE_DIR)
    if not options.recorded_dir:
        ensure_recorded(run.root, ranks, capture=False)  # derived from RUN/capture when there is one
    data.update(host_speed(timed))
    result = None
    failure: RankOOMError | None = None
    try:
        result = emulate(run.root, options)
    except RankOOMError as e:
        failure = e  # the report is still written: OOM is a result of the emulation
    ooms = {o.rank: o for o in failure.ooms} if failure is not None else {}
    real_nodes, groups = {}, {}
    origin = None
    for r in ranks:
        rec = _record(out, r)
        row: dict = {"oom": False}
        if r in ooms:
            o = ooms[r]
            row["oom"] = {"step": o.step, "requested_bytes": o.requested_bytes, "cap_bytes": o.cap_bytes,
                          "in_use_bytes": o.in_use_bytes, "device": o.device, "message": o.message}
            row["error"] = o.message.splitlines()[0] if o.message else ""
        elif failure is not None:
            row["stopped"] = True  # stopped with the run when another rank ran out of memory
        if result is not None:
            got = result.ranks[r]
            row.update(summarize_steps(got.step_times_ns, skip))
            row.update(losses=list(got.losses), num_ops=got.num_ops, diverged_ops=list(got.diverged_ops))
        if rec is not None:
            if result is None:  # the record of a rank that ran out of memory: the steps it finished
                row.update(summarize_steps(rec.summary.step_times_ns, skip))
                row.update(losses=list(rec.summary.losses))
            row.update(peak_memory_bytes=rec.summary.peak_memory_bytes,
                       measured_peak_memory_bytes=rec.summary.measured_peak_memory_bytes,
                       memory_source=rec.summary.memory_source)
            real_nodes[r] = tuple(rec.nodes)
            origin = rec.clock_origin_ns
            step_ns = row.get("step_ms")
            if step_ns:
                row["idle_fraction"] = idle_fraction(rec.nodes, [round(x * 1e6) for x in step_ns], skip)
            groups.update({g.group_id: g for g in rec.groups})
        if timed is not None:
            ends = [n.start_ns for n in timed.nodes[r] if n.kind is NodeKind.MARK and n.mark == "step_end"]
            pred = summarize_steps([b - a for a, b in zip([0, *ends[:-1]], ends)][: options.steps], skip)
            row["predicted_mean_ms"] = pred["mean_ms"]
            row["predicted_step_ms"] = pred["step_ms"]
        data["ranks"][str(r)] = row
    if job.moe_router is not None:
        data["moe_router"] = _router(run, out, ranks, job.world_size)
    recorded, tracked = _recorded(run, ranks, skip, options.steps)
    if recorded:
        data["recorded"] = recorded
    if tracked:
        data["recorded_timed_with_tracker"] = True
    if timed is not None and timed_run_tracked(job, options):
        data["sandbox_timed_with_tracker"] = True
    if failure is not None:
        data["failed"] = {"rank": failure.rank, "oom": True, "oom_ranks": sorted(ooms)}
    if result is not None:
        data["wall_s"] = result.wall_s
        data["replayers"] = [dataclasses.asdict(p) for p in result.replayers]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / REPORT_FILE, dumps_strict(data, indent=1))
    if real_nodes:
        cosim = _cosim_nodes(timed, out, origin) if timed is not None else {}
        if cosim:
            data["vranks_idle_fraction"] = _vrank_idle(cosim, skip)
            atomic_write_text(out / REPORT_FILE, dumps_strict(data, indent=1))
        graph = emulation_graph(timed, real_nodes, groups, options.steps, job.world_size, cosim)
        write_chrome_trace(out / TIMELINE_FILE, _timeline(graph, real_nodes, cosim=bool(cosim)))
        _write_gantt(graph, skip, out)
    else:
        raise RunDirError(f"{out}: no sandbox rank left a record; see the logs there")
    log.info("emulation report in %s", out)
    return EmulationReport(out, data, result, real_nodes, groups)
