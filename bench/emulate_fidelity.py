"""prism emulate vs a real run: iteration time of the sandbox ranks (issue #5's timing acceptance).

The synthetic timing job (sleep compute, dp x pp 1F1B, 8 microbatches, fwd 10 / bwd 20 ms, stage 2
x1.5 slower, DP replica 1 x1.2 slower) is recorded for real (all W ranks, gloo), captured once
(recorded data), calibrated slice by slice (``--slice-size`` S, default 2, ``prism calibrate``; each slice measured twice, each node
taking its median over the takes) and emulated with 2 sandbox
ranks while the other W − 2 ranks are vranks on the timed co-simulation clock. The sandbox is
stage 1 of replica 0 (rank dp) and the slowest rank (stage 2 of replica 1, rank 2·dp + 1).

Each run has one warm-up step, 5 measured steps and one cool-down step: on this oversubscribed
host the ranks that finish first leave the script (``destroy_process_group``, writing their
records) while the others still run their last step, which slowed that step of the early stages
by up to 6 % in the real run (W=16) and not in an emulation, whose other ranks are virtual.

The host is shared, so both sides are repeated and compared step by step as medians: the real
run ``--real-repeats`` times (the first one's graph is the structure the calibration uses), the
emulation ``--repeats`` times. Reported per shape and sandbox rank, over the measured steps: the
real iteration time, the emulated one with its mean and max-step relative error, the calibrated
prediction, optionally an ASAP emulation (vranks answering at once, no timed graph) for scale.
From timeline.json (and, for comparison, from the real run's graph): the idle fraction of each
pipeline stage (the 1F1B bubble plus the waits on the slow stage) and the compute span durations
of the slow stage and the slow replica against the others (the stragglers), so both are seen
where users look.

    python bench/emulate_fidelity.py                         # W=16 (dp2 x pp8) and W=32 (dp4 x pp8)
    python bench/emulate_fidelity.py --shapes 2x4 --repeats 1
    python bench/emulate_fidelity.py --keep /tmp/fid --reuse # reuse the real runs / timed graphs there

``--examples``: instead of the synthetic shapes, every example (W=8; pp-noopt W=4) at long (>= 50 ms) and
default step sizes, within ``--budget-s`` (bench/_examples_fidelity.py), JSON to
bench/results/emulate_fidelity_16core.json:

    python bench/emulate_fidelity.py --examples all --budget-s 500 --parallel 2 --slice-size 4 --calibration-repeats 1

JSON goes to ``--out`` (default bench/results/emulate_fidelity.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.calibration import DEFAULT_MERGE, MERGES
from prism.cli import positive_int
from prism.core.config import load_job
from prism.core.rundir import RunDir
from prism.graph.io import read_graph
from prism.graph.records import NodeKind
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import TIMELINE_FILE, emulate_and_report
from prism.vrank_replayer.fidelity import median_steps, step_errors
from prism.vrank_replayer.launch import capture_job

ROOT = Path(__file__).resolve().parents[1]
FWD_MS, BWD_MS, MICROBATCHES = 10.0, 20.0, 8
SLOW_STAGE, SLOW_FACTOR, SLOW_REPLICA, SLOW_REPLICA_FACTOR = 2, 1.5, 1, 1.2


def synthetic_job(dp: int, pp: int, steps: int):
    job = load_job(ROOT / "examples/synthetic/job.yaml")
    args = ("--steps", str(steps), "--dp", str(dp), "--pp", str(pp), "--microbatches", str(MICROBATCHES),
            "--fwd-ms", str(FWD_MS), "--bwd-ms", str(BWD_MS),
            "--slow-stage", str(SLOW_STAGE), "--slow-factor", str(SLOW_FACTOR),
            "--slow-replica", str(SLOW_REPLICA), "--slow-replica-factor", str(SLOW_REPLICA_FACTOR))
    world = dp * pp
    return dataclasses.replace(job, args=args, world_size=world, ranks_per_node=world,
                               parallelism=dataclasses.replace(job.parallelism, dp=dp, pp=pp))


def stage_of(rank: int, dp: int) -> int:
    return rank // dp  # rank = stage * dp + replica (the script's layout)


# ------------------------------------------------------------------------------ timeline checks


def _trace_lanes(trace: dict) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[float]]]:
    """Per pid: compute spans (start, dur) in µs, and step_end marks."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    ends: dict[int, list[float]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("tid") == 0 and ev.get("name") == "compute":
            spans[ev["pid"]].append((ev["ts"], ev["dur"]))
        elif ev.get("ph") == "i" and ev.get("name") == "step_end":
            ends[ev["pid"]].append(ev["ts"])
    return spans, {p: sorted(v) for p, v in ends.items()}


def _graph_lanes(graph) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[float]]]:
    spans, ends = {}, {}
    for r, nodes in graph.nodes.items():
        spans[r] = [(n.start_ns / 1e3, n.duration_ns / 1e3) for n in nodes
                    if n.kind is NodeKind.COMPUTE and n.start_ns >= 0]
        ends[r] = sorted(n.start_ns / 1e3 for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end")
    return spans, ends


def pipeline_view(spans, ends, dp: int, pp: int, skip: int, kept: int) -> dict:
    """Idle fraction per stage and mean forward/backward-sized compute span per rank, over the
    measured steps ``skip`` .. ``kept`` - 1 (step s runs from step_end s-1 to step_end s)."""
    idle: dict[int, list[float]] = defaultdict(list)
    span_ms: dict[int, float] = {}
    for r, marks in ends.items():
        windows = [(marks[s - 1], marks[s]) for s in range(max(1, skip), min(kept, len(marks)))]
        if not windows:
            continue
        busy_frac, big = [], []
        for a, b in windows:
            inside = [(ts, d) for ts, d in spans.get(r, ()) if a <= ts < b]
            busy_frac.append(sum(d for _, d in inside) / (b - a))
            big.extend(d for _, d in inside if d >= 0.5 * FWD_MS * 1e3)  # the sleeps, not the overhead spans
        idle[stage_of(r, dp)].append(1.0 - statistics.fmean(busy_frac))
        span_ms[r] = statistics.fmean(big) / 1e3 if big else float("nan")
    by_stage = {s: statistics.fmean(v) for s, v in sorted(idle.items())}

    def span(stage: int, replica: int) -> float:
        return span_ms.get(stage * dp + replica, float("nan"))

    # Like against like: the last stage's forward and backward are one span (no message between).
    replica_ratios = [span(s, SLOW_REPLICA) / statistics.fmean(span(s, d) for d in range(dp) if d != SLOW_REPLICA)
                      for s in range(pp)]
    stage_ratios = [span(SLOW_STAGE, d) / span(SLOW_STAGE - 1, d) for d in range(dp)]
    return {
        "idle_fraction_by_stage": by_stage,
        "mean_span_ms_by_rank": span_ms,
        "slow_replica_span_ratio": statistics.fmean(replica_ratios),
        "slow_stage_span_ratio": statistics.fmean(stage_ratios),
    }


def expected_view(dp: int, pp: int) -> dict:
    """What the job's arguments imply: the straggler factors, and each stage's compute share when
    the slowest rank (slow stage x slow replica) sets the pace with no bubble of its own."""
    slowest = MICROBATCHES * (FWD_MS + BWD_MS) * SLOW_FACTOR * SLOW_REPLICA_FACTOR
    per_stage = {}
    for s in range(pp):
        f = SLOW_FACTOR if s == SLOW_STAGE else 1.0
        busy = statistics.fmean(MICROBATCHES * (FWD_MS + BWD_MS) * f
                                * (SLOW_REPLICA_FACTOR if d == SLOW_REPLICA else 1.0) for d in range(dp))
        per_stage[s] = busy / slowest
    return {"slow_replica_span_ratio": SLOW_REPLICA_FACTOR, "slow_stage_span_ratio": SLOW_FACTOR,
            "busy_share_of_slowest_by_stage": per_stage}


# -------------------------------------------------------------------------------------- one shape


def run_shape(dp: int, pp: int, *, measured: int, repeats: int, real_repeats: int, calibration_repeats: int, slice_size: int = 2,
              asap: bool, run: Path, reuse: bool, ranks: tuple[int, ...] | None) -> dict:
    skip = load_job(ROOT / "examples/synthetic/job.yaml").iterations.warmup
    job = synthetic_job(dp, pp, skip + measured + 1)  # + a cool-down step (module docstring)
    kept = skip + measured
    ranks = ranks or (dp, SLOW_STAGE * dp + SLOW_REPLICA)
    wall: dict[str, float] = {}
    log = logging.getLogger("bench")
    # Real runs: the first is the run directory (its graph is the structure the calibration uses),
    # the others are repeats for the ground truth's median.
    real_dirs = [run, *(run / "real-repeats" / str(i) for i in range(1, real_repeats))]
    t_rec = []
    for d in real_dirs:
        if reuse and (d / "graph" / "real" / "manifest.pb").is_file() and RunDir(d).load_job().args == job.args:
            continue
        if d == run:  # a new structure: the timed graph and recorded data of an older one do not apply
            for stale in ("graph/timed", "capture", "payloads", "calibration"):
                shutil.rmtree(run / stale, ignore_errors=True)
        t0 = time.time()
        record_job(job, d)
        t_rec.append(time.time() - t0)
        log.warning("W=%d: real run %s recorded in %.0f s", job.world_size, d, t_rec[-1])
    if t_rec:
        wall["record_each"] = statistics.median(t_rec)
    reals = [read_graph(d / "graph" / "real") for d in real_dirs]
    if not (run / "graph" / "timed" / "manifest.pb").is_file() or not reuse:
        if not all((run / "capture" / f"rank-{r:05d}.json").is_file() for r in range(job.world_size)):
            t0 = time.time()
            capture_job(job, run)
            wall["capture"] = time.time() - t0
        t0 = time.time()
        shutil.rmtree(run / "calibration", ignore_errors=True)
        cal = calibrate_run(run, slice_size=slice_size, skip_steps=skip, repeats=calibration_repeats)
        wall["calibrate"] = time.time() - t0
        log.warning("W=%d: %d slices calibrated in %.0f s", job.world_size, len(cal.slices), wall["calibrate"])
    timed = read_graph(run / "graph" / "timed")
    emus, t_emu = [], []
    for i in range(repeats):
        t0 = time.time()
        emus.append(emulate_and_report(run, EmulateOptions(ranks=ranks), skip_steps=skip))
        t_emu.append(time.time() - t0)
        log.warning("W=%d: emulation %d/%d in %.0f s", job.world_size, i + 1, repeats, t_emu[-1])
    wall["emulate_each"] = statistics.median(t_emu)
    asap_emu = emulate_and_report(run, EmulateOptions(ranks=ranks), use_timed=False, skip_steps=skip) if asap else None

    rows = {}
    for r in ranks:
        real_runs = [[s / 1e6 for s in g.summaries[r].step_times_ns][:kept] for g in reals]
        real_ms = median_steps(real_runs)
        ends = [n.start_ns for n in timed.nodes[r] if n.kind is NodeKind.MARK and n.mark == "step_end"]
        pred_ms = [(b - a) / 1e6 for a, b in zip([0, *ends[:-1]], ends, strict=False)][:kept]
        emu_runs = [e.data["ranks"][str(r)]["step_ms"][:kept] for e in emus]
        rows[r] = {
            "stage": stage_of(r, dp), "replica": r % dp,
            "real_step_ms": real_ms,
            "real_runs_step_ms": real_runs,
            "emulated": dataclasses.asdict(step_errors(median_steps(emu_runs), real_ms, skip)),
            "emulated_step_ms": median_steps(emu_runs),
            "emulated_runs": [dataclasses.asdict(step_errors(e, real_ms, skip)) for e in emu_runs],
            "emulated_runs_step_ms": emu_runs,
            "emulated_vs_each_real_run": [dataclasses.asdict(step_errors(median_steps(emu_runs), x, skip))
                                          for x in real_runs],
            "calibrated_prediction": dataclasses.asdict(step_errors(pred_ms, real_ms, skip)),
            "calibrated_step_ms": pred_ms,
        }
        if asap_emu is not None:
            rows[r]["asap_emulation"] = dataclasses.asdict(
                step_errors(asap_emu.data["ranks"][str(r)]["step_ms"][:kept], real_ms, skip))
    median_emu = emus[sorted(range(repeats), key=lambda i: statistics.fmean(
        statistics.fmean(emus[i].data["ranks"][str(r)]["step_ms"][skip:kept]) for r in ranks))[(repeats - 1) // 2]]
    trace = json.loads((median_emu.out_dir / TIMELINE_FILE).read_text())
    return {
        "world_size": job.world_size, "dp": dp, "pp": pp, "sandbox_ranks": list(ranks), "args": list(job.args),
        "skip_steps": skip, "measured_steps": measured, "cooldown_steps": 1, "repeats": repeats,
        "real_repeats": real_repeats, "calibration_repeats": calibration_repeats, "slice_size": slice_size, "wall_s": wall,
        "mean_abs_rel_error": max(abs(v["emulated"]["mean_rel_error"]) for v in rows.values()),
        "max_step_rel_error": max(v["emulated"]["max_rel_error"] for v in rows.values()),
        "ranks": rows,
        "timeline": {"file": str(median_emu.out_dir / TIMELINE_FILE),
                     **pipeline_view(*_trace_lanes(trace), dp, pp, skip, kept)},
        "real_graph": pipeline_view(*_graph_lanes(reals[0]), dp, pp, skip, kept),
        "expected": expected_view(dp, pp),
    }


def print_shape(res: dict, console: Console) -> None:
    t = Table(title=f"W={res['world_size']} (dp{res['dp']}×pp{res['pp']}, 1F1B, {MICROBATCHES} microbatches), sandbox "
                    f"{res['sandbox_ranks']}, {res['measured_steps']} measured steps; per-step medians of "
                    f"{res['real_repeats']} real runs and {res['repeats']} emulations",
              title_justify="left")
    cols = ["rank", "real ms", "emulated ms", "mean err", "max step err", "calibrated ms", "cal. err"]
    asap = any("asap_emulation" in v for v in res["ranks"].values())
    cols += ["ASAP emul. ms", "ASAP err"] if asap else []
    for c in cols:
        t.add_column(c, justify="right")
    for r, v in res["ranks"].items():
        e, c = v["emulated"], v["calibrated_prediction"]
        row = [str(r), f"{e['real_mean_ms']:.1f}", f"{e['mean_ms']:.1f}", f"{e['mean_rel_error'] * 100:+.2f} %",
               f"{e['max_rel_error'] * 100:.2f} %", f"{c['mean_ms']:.1f}", f"{c['mean_rel_error'] * 100:+.2f} %"]
        if asap:
            a = v["asap_emulation"]
            row += [f"{a['mean_ms']:.1f}", f"{a['mean_rel_error'] * 100:+.2f} %"]
        t.add_row(*row)
    console.print(t)
    s = Table(title="timeline.json (emulated) vs the real run's graph", title_justify="left")
    for c in ("stage", *[f"{st}" for st in res["timeline"]["idle_fraction_by_stage"]]):
        s.add_column(c, justify="right")
    for name, view in (("idle, timeline", res["timeline"]), ("idle, real run", res["real_graph"])):
        s.add_row(name, *[f"{v * 100:.0f} %" for v in view["idle_fraction_by_stage"].values()])
    console.print(s)
    x = res["expected"]
    console.print(f"slow replica spans ×{res['timeline']['slow_replica_span_ratio']:.3f} (real ×"
                  f"{res['real_graph']['slow_replica_span_ratio']:.3f}, job ×{x['slow_replica_span_ratio']}); "
                  f"slow stage spans ×{res['timeline']['slow_stage_span_ratio']:.3f} (real ×"
                  f"{res['real_graph']['slow_stage_span_ratio']:.3f}, job ×{x['slow_stage_span_ratio']})")
    console.print(f"wall: {', '.join(f'{k} {v:.0f} s' for k, v in res['wall_s'].items())}")


def _device_paths(text: str) -> str:
    paths = text.split(",")
    if not paths or any(p not in ("auto", "host", "lanes") for p in paths) or len(set(paths)) != len(paths):
        raise argparse.ArgumentTypeError(f"{text!r}: one or more of auto, host, lanes, comma-separated, each once")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="2x8,4x8", help="dp×pp shapes, comma-separated (default: W=16 and W=32)")
    p.add_argument("--ranks", default=None, help="sandbox ranks (default: rank dp and the slowest rank)")
    p.add_argument("--measured", type=int, default=5,
                   help="measured steps (the runs add a warm-up and a cool-down step)")
    p.add_argument("--repeats", type=int, default=3, help="emulations per shape; per-step medians are compared")
    p.add_argument("--real-repeats", type=int, default=3, help="real runs per shape; per-step medians are the truth")
    p.add_argument("--calibration-repeats", type=int, default=2,
                   help="takes of each calibration slice (--calibration-merge says how they become the timing)")
    p.add_argument("--calibration-merge", choices=MERGES, default=DEFAULT_MERGE,
                   help="with --examples: how each rank's takes become its timing (prism calibrate --merge)")
    p.add_argument("--slice-size", type=int, default=2,
                   help="real ranks per calibration slice (2 on a 2-core host; more where cores allow)")
    p.add_argument("--asap", action="store_true", help="also run one ASAP emulation (no timed graph)")
    p.add_argument("--keep", default=None, help="directory for the run directories (default: a temporary one)")
    p.add_argument("--reuse", action="store_true", help="with --keep: reuse real runs and timed graphs found there")
    p.add_argument("--out", default=None, help="JSON (default: bench/results/emulate_fidelity.json, with "
                                               "--examples emulate_fidelity_16core.json)")
    p.add_argument("--examples", nargs="+", default=None, metavar="NAME",
                   help="every example ('all') or these, at W=8 (bench/_examples_fidelity.py)")
    p.add_argument("--sizes", default="long,default", help="with --examples: long (>= 50 ms steps), default")
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="with --examples: start no job that would not end within this many seconds")
    p.add_argument("--first-job-s", type=float, default=60.0,
                   help="with --examples: the time assumed for a job before one has finished")
    p.add_argument("--timeout", type=float, default=300.0, help="with --examples: stall limit of each run")
    p.add_argument("--parallel", type=int, default=1, help="with --examples: jobs at once")
    p.add_argument("--device-path", default="auto", type=_device_paths,
                   help="with --examples: the data path of slices and emulations (CPU jobs: host or lanes); "
                        "several, comma-separated (host,lanes), are measured one after the other on each job "
                        "against the same real runs, one result per path")
    p.add_argument("--world", type=int, default=None, help="with --examples: another world size than the job files'")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="with --examples: warm-up steps before the 5 measured ones (default: the job file's, 1; "
                        "pp-noopt 2)")
    p.add_argument("--replayers", type=positive_int, default=1,
                   help="with --examples: replayer processes of each emulation (prism emulate --replayers)")
    p.add_argument("--order", choices=["interleave", "alternate", "phases"], default="interleave",
                   help="with --examples: alternate emulation i with real run i+1 after the calibration, and "
                        "record a real run between the calibration's rounds of takes too (interleave, the "
                        "default; a drifting host meets every side), alternate the emulations only "
                        "(alternate, sessions 8-45), or every real run, the calibration, then every "
                        "emulation (phases, sessions 5-7)")
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    ranks = tuple(int(r) for r in ns.ranks.split(",")) if ns.ranks else None
    if ns.examples:
        _examples(ns, ranks)
        return
    ns.out = ns.out or str(ROOT / "bench" / "results" / "emulate_fidelity.json")
    console = Console()
    results = []
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        base = Path(ns.keep or tmp)
        for shape in ns.shapes.split(","):
            dp, pp = (int(x) for x in shape.lower().split("x"))
            res = run_shape(dp, pp, measured=ns.measured, repeats=ns.repeats, real_repeats=ns.real_repeats,
                            calibration_repeats=ns.calibration_repeats, slice_size=ns.slice_size, asap=ns.asap,
                            run=base / f"w{dp * pp}-dp{dp}xpp{pp}", reuse=ns.reuse, ranks=ranks)
            print_shape(res, console)
            results.append(res)
    summary = {
        "benchmark": "emulate_fidelity",
        "target": {"mean_abs_rel_error": 0.01, "max_step_rel_error": 0.02},
        "shapes": results,
        "met": all(r["mean_abs_rel_error"] <= 0.01 and r["max_step_rel_error"] <= 0.02 for r in results),
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    console.print(f"{out}: target {'met' if summary['met'] else 'NOT met'}")


def _examples(ns, ranks) -> None:
    from _examples_fidelity import EXAMPLES, SIZES, run_all

    names = list(EXAMPLES) if ns.examples == ["all"] else ns.examples
    unknown = [n for n in names if n not in EXAMPLES]
    sizes = ns.sizes.split(",")
    if unknown or not set(sizes) <= set(SIZES):
        raise SystemExit(f"unknown examples {unknown} (known: {', '.join(EXAMPLES)}) or sizes {sizes} (known: {SIZES})")
    out = Path(ns.out or ROOT / "bench" / "results" / "emulate_fidelity_16core.json")
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        summary = run_all(names, sizes, Path(ns.keep or tmp), out, budget_s=ns.budget_s, first_job_s=ns.first_job_s,
                          parallel=ns.parallel, keep=bool(ns.keep),
                          ranks=ranks, repeats=ns.repeats, real_repeats=ns.real_repeats,
                          slice_size=ns.slice_size, calibration_repeats=ns.calibration_repeats, timeout_s=ns.timeout,
                          order=ns.order, device_path=ns.device_path, world=ns.world, warmup=ns.warmup_steps,
                          replayers=ns.replayers, calibration_merge=ns.calibration_merge)
    print(f"{out}: {sum('ranks' in j for j in summary['jobs'])} of {len(summary['jobs'])} jobs measured; "
          f"long-step targets {'met' if summary.get('met_long') else 'NOT met'}; real runs within the mean target "
          f"of each other: {', '.join(summary.get('long_jobs_real_within_target') or []) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
