"""``bench/emulate_fidelity.py --examples``: every example, real runs vs emulations.

Per example (at W=8: ddp, fsdp2, tp, pp 1F1B and interleaved, moe, hybrid, synthetic, and each of
the first seven with sleep compute, ``<name>-sleep``; at W=4: pp-noopt, a pipeline without an
optimizer) and size — ``long`` (the examples' size arguments chosen so a step takes >= 50 ms of
compute on one core: rank 0 alone measured 80-120 ms of CPU per step on the 2-core host; the sleep
variants' and pp-noopt's own job files) and ``default`` (the job file's arguments: short steps) —
the job runs with its job file's warm-up steps (1; pp-noopt 2), 5 measured and 1 cool-down step:

1. a real run (``record_job``): the structure the calibration uses;
2. one capture run and ``calibrate_run`` (slices of ``--slice-size`` real ranks);
3. ``--repeats`` emulations of two sandbox ranks (``--ranks``, else 2 and 5; pp-noopt 1 and 2) on the timed clock, each
   followed by one of ``--real-repeats`` more real runs (``--order alternate``), whose
   medians are the truth. ``--order interleave`` (the default since session 46) also records one
   real run between the calibration's rounds of takes (``calibrate_run(between_rounds=…)``; k takes
   of each slice: k − 1 more real runs), and the truth is the median of all those real runs: the
   calibration and the emulations are each compared with real runs of their own stretch of a
   drifting host (pp 1F1B on 16 cores, session 45: the calibration's window ran its compute 3 %
   slower than the real runs after it). ``--order phases`` (sessions 5-7) compares the emulations
   with the first ``--real-repeats`` real runs taken before the calibration instead.

Before every real run a short single-threaded matmul probe times the host
(:func:`prism.core.host_speed.probe_ms`); the calibration's probes (before its first slice and after
each) and each emulation's (before it starts) come from prism calibrate and emulate themselves
(``host_probe_ms`` per phase): the 16-core GPU machine is a VM whose CPU speed drifted by up to
25 % between phases in session 7, which a phase-ordered bench turns into an emulation "error".

Every run is timed without the CPU memory tracker (``PRISM_MEMORY=rss`` in the job's environment:
real and emulated alike), so the figures compare like with like. Reported per rank: per-step
medians of the real runs and of the emulations, the emulated mean and max-step errors, the
calibrated prediction's error and, beside it, ``calibrated_merges`` (the same takes merged
otherwise, each but the one ``--calibration-merge`` calibrated with: ``rotated``, prism's default,
one graph whose step s comes from take (s − skip) mod k, ``median``, every node its median over the
steps and takes, and ``per-step``, their own spans step by step averaged over the takes;
bench/_calibration_takes.py; not emulated),
the emulation against its own timed graph
(``emulated_vs_calibrated``: what the emulator adds, apart from the calibration's error against
the real run), the emulator's overhead per comm op of the rank (emulated −
real ms per step over the rank's comm ops per step), ``real_run_spread`` (each real run against
the per-step median of the others: the ground truth's own error, which no emulation can be shown
to beat; ``emulated_run_spread`` the same of the emulations), and ``breakdown_ms``: the median measured
step split into the rank's compute and the rest (comm calls, waits, gaps) for the real runs, the
timed graph and the emulations — a host that drifted shows in the compute, the emulator's own cost
in the rest.

``--parallel N`` runs N jobs at once (each is W=8 processes plus a replayer: 2 fit 32 cores).
``--budget-s``: a job is started only when the time spent so far plus the longest job so far (or
``--first-job-s`` before any) fits; the rest are recorded as skipped. The JSON is rewritten after
every job, so a run stopped from outside keeps what finished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from prism.calibration import DEFAULT_MERGE
from prism.core.config import load_job
from prism.core.host_speed import probe_ms as host_probe_ms
from prism.graph.io import read_graph
from prism.graph.records import NodeKind
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report
from prism.vrank_replayer.fidelity import median_steps, run_spread, step_errors
from prism.vrank_replayer.launch import capture_job

from _calibration_takes import MERGES as TAKE_MERGES  # bench/, beside this module
from _calibration_takes import CalibrationTakes

ROOT = Path(__file__).resolve().parents[1]
MEASURED, COOLDOWN = 5, 1
DEFAULT_RANKS = (2, 5)

# name -> (job file, long-step size arguments[, sandbox ranks when --ranks is not given: DEFAULT_RANKS]);
# the default size is the job file's own arguments. An example without long-step arguments has one
# size: its job file's steps are already long (sleep compute), so it runs as "long" only.
EXAMPLES: dict[str, tuple] = {
    "ddp": ("examples/ddp/job.yaml", ("--batch", "2048", "--dim", "128", "--hidden", "512", "--layers", "4")),
    "fsdp2": ("examples/fsdp2/job.yaml",
              ("--batch", "16", "--seq", "128", "--dim", "128", "--heads", "4", "--layers", "2", "--vocab", "256")),
    "tp": ("examples/tp/job.yaml", ("--batch", "2048", "--dim", "256", "--hidden", "1024", "--layers", "2")),
    "pp-1f1b": ("examples/pp/job.yaml", ("--microbatch-size", "256", "--dim", "256")),
    "pp-interleaved": ("examples/pp/job-interleaved.yaml", ("--microbatch-size", "256", "--dim", "256")),
    "moe": ("examples/moe/job.yaml", ("--tokens", "4096", "--dim", "128", "--hidden", "512")),
    "hybrid": ("examples/hybrid/job.yaml", ("--microbatch-size", "256", "--dim", "256")),
    "synthetic": ("examples/synthetic/job.yaml", ("--microbatches", "4", "--fwd-ms", "5", "--bwd-ms", "10")),
    # each structure (real DDP / FSDP2 / DTensor / pipelining / all-to-all comm) with sleep compute
    # (--sleep-ms, in the job file): timing that does not depend on the host's cores
    "ddp-sleep": ("examples/ddp/job-sleep.yaml", ()),
    "fsdp2-sleep": ("examples/fsdp2/job-sleep.yaml", ()),
    "tp-sleep": ("examples/tp/job-sleep.yaml", ()),
    "pp-sleep": ("examples/pp/job-sleep.yaml", ()),
    "pp-interleaved-sleep": ("examples/pp/job-interleaved-sleep.yaml", ()),
    "moe-sleep": ("examples/moe/job-sleep.yaml", ()),
    "hybrid-sleep": ("examples/hybrid/job-sleep.yaml", ()),
    # W=4, no optimizer (steps found from the comm sequence's period), ~95 ms steps as it is
    "pp-noopt": ("examples/pp_sleep_noopt/job.yaml", (), (1, 2)),
}
SIZES = ("long", "default")

log = logging.getLogger("bench")


def sizes_of(name: str) -> tuple[str, ...]:
    """The sizes ``name`` has: both, or "long" alone when its job file's steps already are (asked
    for "default", it runs at "long")."""
    return SIZES if EXAMPLES[name][1] else ("long",)


def example_job(name: str, size: str, world: int | None = None, warmup: int | None = None):
    """The example's job with its own warm-up steps (its job file's ``iterations.warmup``: 1, and 2
    for pp-noopt, whose real run settles only then; ``warmup`` overrides it) + 5 measured + 1
    cool-down, untracked memory, at ``size``; ``world``: another world size than the job file's
    (one node)."""
    path, long_args = EXAMPLES[name][:2]
    job = load_job(ROOT / path)
    args = list(job.args)
    i = args.index("--steps")
    if warmup is None:
        warmup = job.iterations.warmup
    elif warmup < 1:
        raise ValueError(f"{name}: --warmup-steps {warmup}: at least one warm-up step (start-up is not a step)")
    args[i + 1] = str(warmup + MEASURED + COOLDOWN)
    if size == "long":
        args += long_args  # argparse: the last value of a repeated option wins
    if world is not None:  # the data-parallel degree absorbs the change
        par = job.parallelism
        rest = par.tp * par.pp * par.cp
        if world % rest:
            raise ValueError(f"{name}: --world {world} is not a multiple of tp*pp*cp = {rest}")
        job = dataclasses.replace(job, world_size=world, ranks_per_node=world,
                                  parallelism=dataclasses.replace(par, dp=world // rest))
    return dataclasses.replace(job, name=f"{name}-{size}", args=tuple(args),
                               iterations=dataclasses.replace(job.iterations, warmup=warmup, measured=MEASURED),
                               env={**job.env, "PRISM_MEMORY": "rss"})


def _comm_ops_per_step(nodes) -> float:
    steps = sum(1 for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end")
    return sum(1 for n in nodes if n.is_comm) / max(1, steps)


def _breakdown_ms(nodes, steps: range) -> dict[str, float]:
    """Median over ``steps`` of the rank's compute (COMPUTE nodes) and the rest of the step (its
    comm calls, waits and gaps): the sandbox's compute meets the host's speed of the moment, the
    rest the vranks' calibrated pace plus the emulator's own cost per op."""
    ends = [n.start_ns for n in nodes if n.kind is NodeKind.MARK and n.mark == "step_end"]
    step_ns = [b - a for a, b in zip([ends[0], *ends], ends, strict=False)]  # step 0's start is not marked
    compute: dict[int, int] = {}
    for n in nodes:
        if n.kind is NodeKind.COMPUTE and n.duration_ns > 0:
            compute[n.step] = compute.get(n.step, 0) + n.duration_ns
    kept = [s for s in steps if s < len(step_ns)]
    if not kept:
        return {}
    c = statistics.median(compute.get(s, 0) / 1e6 for s in kept)
    total = statistics.median(step_ns[s] / 1e6 for s in kept)
    return {"compute_ms": round(c, 3), "rest_ms": round(total - c, 3)}


def example_ranks(name: str) -> tuple[int, ...]:
    """The example's sandbox ranks when ``--ranks`` names none."""
    entry = EXAMPLES[name]
    return tuple(entry[2]) if len(entry) > 2 else DEFAULT_RANKS


ORDERS = ("interleave", "alternate", "phases")


def run_example(name: str, size: str, run: Path, *, ranks: tuple[int, ...] | None, repeats: int, real_repeats: int,
                slice_size: int, calibration_repeats: int, timeout_s: float, order: str = "interleave",
                device_path: str = "auto", world: int | None = None, warmup: int | None = None,
                replayers: int = 1, calibration_merge: str = DEFAULT_MERGE) -> list[dict]:
    """``order``: ``phases`` runs every real run, then the calibration, then every emulation;
    ``alternate`` records the first real run (the structure the calibration uses), calibrates, then
    alternates emulation i with real run i + 1, so a drift of the host's speed meets both sides
    (the first real run is kept out of the medians then, unless there is no other); ``interleave``
    also records a real run between the calibration's rounds of takes. ``device_path``:
    the data path of the calibration's slices and the emulations (on CPU: host or lanes); several,
    comma-separated, are measured one after the other on the same job against the same real runs
    (calibration and emulations per path; with ``alternate``, ``real_repeats`` real runs per path,
    each beside an emulation of that path). One result per path. ``warmup``: warm-up steps instead
    of the job file's (docs/emulate.md: a real run's first step after one warm-up step still holds
    the ranks' start-up skew). ``replayers``: replayer processes of each emulation (the calibration's
    slices keep their one). ``calibration_merge``: ``prism calibrate --merge``."""
    job = example_job(name, size, world, warmup)
    ranks = ranks or example_ranks(name)
    if outside := [r for r in ranks if not 0 <= r < job.world_size]:
        raise ValueError(f"{name}: sandbox ranks {outside} are outside its world of {job.world_size} (--ranks)")
    paths = device_path.split(",")
    warmup = job.iterations.warmup
    kept = warmup + MEASURED
    shutil.rmtree(run, ignore_errors=True)
    wall: dict[str, float] = {}
    probes: dict[str, list[float]] = {"record": []}
    t0 = time.time()
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    beside = order != "phases"
    between_rounds = max(0, calibration_repeats - 1) if order == "interleave" else 0
    per_path_reals = real_repeats + between_rounds if beside else 0
    num_real = 1 + per_path_reals * len(paths) if beside else real_repeats
    real_dirs = [run, *(run / "real-repeats" / str(i) for i in range(1, num_real))]
    first = 1 if beside else len(real_dirs)
    reals = []

    def record_next() -> None:
        probes["record"].append(host_probe_ms())
        reals.append(record_job(job, real_dirs[len(reals)], timeout_s=timeout_s))

    for _ in real_dirs[:first]:
        record_next()
    wall["record_all"] = time.time() - t0
    t0 = time.time()
    capture_job(job, run, timeout_s=timeout_s)
    wall["capture"] = time.time() - t0
    timed, emus, merges = {}, {}, {}
    for path in paths:
        t0 = time.time()
        cal = calibrate_run(run, slice_size=slice_size, skip_steps=warmup, repeats=calibration_repeats,
                            timeout_s=timeout_s, device={"device_path": path}, merge=calibration_merge,
                            between_rounds=(lambda _k: record_next()) if between_rounds else None)
        probes[f"calibrate_{path}"] = list(cal.host_probe_ms)  # before the first take and after each
        wall[f"calibrate_{path}"] = time.time() - t0
        timed[path] = read_graph(run / "graph" / "timed")
        # before another path's slices replace the takes
        takes = CalibrationTakes(run, warmup)
        merges[path] = {m: takes.prediction_steps_ms(m) for m in TAKE_MERGES if m != calibration_merge}
        t0 = time.time()
        emus[path] = []
        for i in range(repeats):
            emus[path].append(emulate_and_report(run, EmulateOptions(ranks=ranks, timeout_s=timeout_s,
                                                                     device_path=path, num_replayers=replayers),
                                                  skip_steps=warmup))
            probes.setdefault(f"emulate_{path}", []).append(emus[path][-1].data["host_probe_ms"])
            if i < real_repeats and beside and len(reals) < len(real_dirs):
                record_next()
        wall[f"emulate_{path}"] = time.time() - t0
    while len(reals) < len(real_dirs):  # more real runs than emulations
        record_next()
    compared = reals[1:] if beside and len(reals) > 1 else reals
    return [_path_result(name, size, job, ranks, path, timed[path], merges[path], emus[path], reals, compared, kept, warmup,
                         wall=wall, probes=probes, repeats=repeats, real_repeats=real_repeats, slice_size=slice_size,
                         calibration_repeats=calibration_repeats, calibration_merge=calibration_merge, order=order)
            for path in paths]


def _path_result(name, size, job, ranks, path, timed, merges, emus, reals, compared, kept, warmup, **settings) -> dict:
    """One data path's comparison with the real runs ``compared`` (``reals[0]`` gives the comm ops
    per step). ``merges``: each other merge of the calibration's takes (bench/_calibration_takes.py)
    with each rank's calibrated steps, reported beside prism's prediction, not emulated."""
    wall, probes = settings.pop("wall"), settings.pop("probes")
    rows = {}
    for r in ranks:
        real_runs = [[s / 1e6 for s in g.summaries[r].step_times_ns][:kept] for g in compared]
        real_ms = median_steps(real_runs)
        emu_runs = [e.data["ranks"][str(r)]["step_ms"][:kept] for e in emus]
        emu_ms = median_steps(emu_runs)
        ends = [n.start_ns for n in timed.nodes[r] if n.kind is NodeKind.MARK and n.mark == "step_end"]
        pred_ms = [(b - a) / 1e6 for a, b in zip([0, *ends[:-1]], ends, strict=False)][:kept]
        emulated = step_errors(emu_ms, real_ms, warmup)
        ops = _comm_ops_per_step(reals[0].nodes[r])
        measured = range(warmup, kept)
        views = {"real": [_breakdown_ms(g.nodes[r], measured) for g in compared],
                 "emulated": [_breakdown_ms(e.nodes[r], measured) for e in emus if r in e.nodes]}
        breakdown = {k: {f: statistics.median(v[f] for v in vs if v) for f in ("compute_ms", "rest_ms")}
                     for k, vs in views.items() if any(vs)}
        breakdown["calibrated"] = _breakdown_ms(timed.nodes[r], measured)
        rows[str(r)] = {
            "real_step_ms": real_ms, "real_runs_step_ms": real_runs,
            "emulated_step_ms": emu_ms, "emulated_runs_step_ms": emu_runs,
            "emulated": dataclasses.asdict(emulated),
            "calibrated_step_ms": pred_ms,
            "calibrated_prediction": dataclasses.asdict(step_errors(pred_ms, real_ms, warmup)),
            "calibrated_merges": {m: {"step_ms": steps[r][:kept],
                                      "prediction": dataclasses.asdict(step_errors(steps[r][:kept], real_ms, warmup))}
                                  for m, steps in merges.items()},
            # The emulation against its own timed graph: what the emulator adds, apart from the
            # calibration's error against the real run.
            "emulated_vs_calibrated": dataclasses.asdict(step_errors(emu_ms, pred_ms, warmup)),
            # The ground truth's own error: no emulation can be shown closer to the real run.
            "real_run_spread": _spread(real_runs, warmup),
            "emulated_run_spread": _spread(emu_runs, warmup),
            "comm_ops_per_step": ops,
            "breakdown_ms": breakdown,
            "overhead_us_per_comm_op": (emulated.mean_ms - emulated.real_mean_ms) * 1e3 / ops if ops else None,
        }
    return {"example": name, "size": size, "args": list(job.args), "world_size": job.world_size,
            "sandbox_ranks": list(ranks), **settings, "real_runs_compared": len(compared), "device_path": path,
            "wall_s": wall,
            "host_probe_ms": probes,
            "mean_abs_rel_error": max(abs(v["emulated"]["mean_rel_error"]) for v in rows.values()),
            "max_step_rel_error": max(v["emulated"]["max_rel_error"] for v in rows.values()),
            "calibrated_abs_rel_error": max(abs(v["calibrated_prediction"]["mean_rel_error"]) for v in rows.values()),
            "real_run_spread_abs_rel_error": max((v["real_run_spread"]["mean_abs_rel_error"]
                                                  for v in rows.values() if v["real_run_spread"]), default=None),
            "ranks": rows}


def _spread(runs: list[list[float]], warmup: int) -> dict | None:
    spread = run_spread(runs, warmup)
    return dataclasses.asdict(spread) if spread else None


def run_all(names: list[str], sizes: list[str], base: Path, out: Path, *, budget_s: float, first_job_s: float,
            parallel: int = 1, keep: bool = False, **kw) -> dict:
    """Every (example, size), long sizes first, ``parallel`` jobs at a time, within ``budget_s``;
    progress on stdout."""
    start = time.time()
    pending: list[tuple[str, str]] = []
    for s in sizes:  # an example of one size runs once, at that size, whichever sizes are asked
        pending += [job for n in names if (job := (n, s if s in sizes_of(n) else sizes_of(n)[0])) not in pending]
    total = len(pending)
    summary = {"benchmark": "emulate_fidelity_examples", "budget_s": budget_s, "parallel": parallel,
               "target": {"mean_abs_rel_error": 0.02, "max_step_rel_error": 0.05, "calibrated_abs_rel_error": 0.02},
               "settings": {k: v for k, v in kw.items() if k != "ranks"},
               "sandbox_ranks": list(kw["ranks"]) if kw["ranks"] else "per example",
               "host_cpus": os.cpu_count(), "jobs": []}
    lock = threading.Lock()
    longest = [first_job_s]

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                name, size = pending.pop(0)
                k = total - len(pending)
                spent = time.time() - start
                if spent + longest[0] > budget_s:
                    print(f"[{spent:5.0f} s] {name} {size}: skipped (needs ~{longest[0]:.0f} s, "
                          f"{budget_s - spent:.0f} s left)", flush=True)
                    summary["jobs"].append({"example": name, "size": size, "skipped": "budget"})
                    _write(summary, out, start)
                    continue
            print(f"[{spent:5.0f} s] {k}/{total} {name} {size} ...", flush=True)
            t0 = time.time()
            try:
                results = run_example(name, size, base / f"{name}-{size}", **kw)
            except Exception as e:  # noqa: BLE001 - recorded, the next job still runs
                log.exception("%s %s failed", name, size)
                results = [{"example": name, "size": size,
                            "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}]
            if not keep:  # a job's run directories take GBs; --keep leaves them for a diagnosis
                shutil.rmtree(base / f"{name}-{size}", ignore_errors=True)
            took = time.time() - t0
            with lock:
                for res in results:
                    res["job_wall_s"] = took
                    if "error" not in res:
                        longest[0] = max(longest[0], took)
                    summary["jobs"].append(res)
                    _print(res, took)
                _write(summary, out, start)

    threads = [threading.Thread(target=worker, name=f"bench-{i}") for i in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary


def _print(res: dict, took: float) -> None:
    name, size = res["example"], res["size"]
    if res.get("device_path", "auto") != "auto":
        size = f"{size} {res['device_path']}"
    if "error" in res:
        print(f"          {name} {size}: FAILED in {took:.0f} s: {res['error']}", flush=True)
        return
    for r, v in res["ranks"].items():
        e, c = v["emulated"], v["calibrated_prediction"]
        per_op = v["overhead_us_per_comm_op"]
        print(f"          {name} {size} r{r}: real {e['real_mean_ms']:.1f} ms, emulated {e['mean_ms']:.1f} ms "
              f"({e['mean_rel_error'] * 100:+.2f} %, max step {e['max_rel_error'] * 100:.2f} %), calibrated "
              f"{c['mean_ms']:.1f} ms ({c['mean_rel_error'] * 100:+.2f} %)"
              + (" (" + ", ".join(f"{m} merge {x['prediction']['mean_rel_error'] * 100:+.2f} %"
                                  for m, x in v["calibrated_merges"].items()) + ")" if v.get("calibrated_merges") else "")
              + (f", emulated vs calibrated {ec['mean_rel_error'] * 100:+.2f} %"
                 if (ec := v.get("emulated_vs_calibrated")) else "")
              + (f", {per_op:+.0f} us per comm op" if per_op is not None else "")
              + (f"; real runs among themselves ±{sp['mean_abs_rel_error'] * 100:.2f} % "
                 f"(max step {sp['max_step_rel_error'] * 100:.2f} %)" if (sp := v.get("real_run_spread")) else ""),
              flush=True)
        b = v.get("breakdown_ms") or {}
        if b:
            print(f"          {name} {size} r{r} compute / rest ms: "
                  + ", ".join(f"{k} {x['compute_ms']:.1f} / {x['rest_ms']:.1f}" for k, x in b.items() if x), flush=True)
    pr = res.get("host_probe_ms") or {}
    spread = ", ".join(f"{k} {min(v):.1f}–{max(v):.1f}" for k, v in pr.items() if v)
    print(f"          {name} {size}: {took:.0f} s" + (f"; host probe ms: {spread}" if spread else ""), flush=True)


def _write(summary: dict, out: Path, start: float) -> None:
    summary["wall_s"] = time.time() - start
    t = summary["target"]
    done = [j for j in summary["jobs"] if "ranks" in j and j["size"] == "long"]
    summary["met_long"] = bool(done) and all(
        j["mean_abs_rel_error"] <= t["mean_abs_rel_error"] and j["max_step_rel_error"] <= t["max_step_rel_error"]
        and j["calibrated_abs_rel_error"] <= t["calibrated_abs_rel_error"] for j in done)
    # Jobs whose real runs agree among themselves within the mean target: only there can the
    # target be shown on this host.
    summary["long_jobs_real_within_target"] = sorted({
        j["example"] for j in done
        if j.get("real_run_spread_abs_rel_error") is not None
        and j["real_run_spread_abs_rel_error"] <= t["mean_abs_rel_error"]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
