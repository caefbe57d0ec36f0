"""Config what-ifs of PrismLLM's Table 1 (issue #13 item 3): emulate a config change of the sandbox
ranks from the UNCHANGED recording, and compare with real runs of the changed job.

The job (tests/assets/jobs/ddp_cfg, ``--job``): examples/ddp at W=2 (a 4-block MLP, one 25 MB
gradient bucket), 6 steps (1 warm-up); ``ddp_cfg_sleep`` is the same with sleep compute, whose time
the host's cores do not move (docs/whatif.md). It is recorded and calibrated
unchanged; then rank 1 (the sandbox) runs with one change while vrank 0 keeps the recording:

* ``recompute``: activation recomputation (``--env DDP_RECOMPUTE=1``: torch.utils.checkpoint on
  every block);
* ``offload``: activations offloaded to host memory (``--env DDP_OFFLOAD_ACTIVATIONS=1``:
  ``saved_tensors_hooks`` that keep autograd's saved tensors as NumPy copies, outside the tracked
  allocator, and bring them back in the backward);
* ``offload_optimizer``: optimizer state offloaded (``--env DDP_OFFLOAD_OPTIMIZER=1``: SGD's
  momentum buffers in host memory and the update computed there, ZeRO-Offload style);
* ``matmul64``: another compute path (``--args '... --matmul float64'``: every Linear in float64).

A second structure: ``tests/assets/jobs/fsdp2_cfg_sleep`` (examples/fsdp2 at W=4, fully_shard per
block, sleep compute) with ``recompute`` and ``offload`` (``FSDP2_RECOMPUTE``,
``FSDP2_OFFLOAD_ACTIVATIONS``); each example's cases set its own ``<EXAMPLE>_*`` knobs.

Two real runs of each change: with the change on every rank (the job's config changed) and on the
sandbox ranks only (``DDP_KNOB_RANKS``: what the emulation models — the vranks are the unchanged
recording). When the change slows the sandbox, the two agree (DDP's step is its slowest rank's);
when it speeds it up, only the sandbox-only run is what the emulation can show. Per case:
``--repeats`` real runs of each kind and emulations, alternated (the host's load drifts). Iteration time: per run the median of the
sandbox rank's measured steps (after the warm-up), then the median over repeats. Peak memory: the
tracked peak of the sandbox rank over the measured steps and over the whole run, each run's bytes,
from a separate untimed memory pass of each real run and emulation, so that every timed run (real,
calibration slice, emulation) runs without the per-op tracker (``--memory-inline``: one run each,
tracked; fine for a job of few aten ops per step, not for fsdp2's ~1,050).
Also the sandbox rank's own compute per step (``compute_ms``: its compute spans, without waits),
real and emulated: on a 2-core host the real job's ranks share the cores with each other, the
emulated sandbox rank only with the replayer. The host's 1-minute load average is saved with each
case.

    python bench/config_whatif.py                 # → bench/results/config_whatif.json
    python bench/config_whatif.py --job tests/assets/jobs/ddp_cfg_sleep/job.yaml   # sleep compute
    python bench/config_whatif.py --cases recompute --repeats 1
    python bench/config_whatif.py --duet          # a VM whose CPU speed drifts (the 16-core machine)

``--duet`` (duet benchmarking, Bulej et al., ICPE 2020): on a VM whose CPU speed drifts by tens of
per cent within minutes, runs taken one after the other meet different machines. The host's
physical cores are split in two halves: real runs of the changed job on one, prism on the other,
*at the same time*, so a drift meets both sides. Per case the calibration is re-taken (on the
prism half, real runs looping on the other half beside it, so it meets the same neighbours as the
emulations do), then each of ``--repeats`` emulations runs beside one real run. Reported per case:
the medians as above (over the concurrent real runs) and ``paired_error``, the median over the
pairs of emulated / real − 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.config import JobConfig, load_job
from prism.core.whatif import SandboxChange
from prism.core.workerspec import record_path
from prism.graph.records import NodeKind
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report
from prism.vrank_replayer.fidelity import run_spread

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests/assets/jobs/ddp_cfg/job.yaml"
TARGET = 0.03


KNOBS = {"recompute": "RECOMPUTE", "offload": "OFFLOAD_ACTIVATIONS", "offload_optimizer": "OFFLOAD_OPTIMIZER"}
"""Case → the example's environment knob (``<EXAMPLE>_<KNOB>=1``; ``<EXAMPLE>_KNOB_RANKS`` limits it)."""
EXAMPLE_CASES = {"ddp": ("none", "recompute", "offload", "offload_optimizer", "matmul64"),
                 "fsdp2": ("none", "recompute", "offload")}


def example_of(job: JobConfig) -> str:
    """The example a job runs (its script's folder under examples/), whose knobs the cases set."""
    name = Path(job.entrypoint).parent.name
    if name not in EXAMPLE_CASES:
        raise SystemExit(f"{job.name}: runs {job.entrypoint}; the config what-ifs need an example with knobs "
                         f"({', '.join(f'examples/{e}' for e in EXAMPLE_CASES)})")
    return name


def cases(job: JobConfig, sandbox: tuple[int, ...]) -> dict[str, tuple[SandboxChange, dict[str, JobConfig]]]:
    """name → (the change as the sandbox gets it, {"all": the changed job every rank of a real run
    runs, "sandbox": the job whose sandbox ranks alone run the change}), for the cases the job's
    example has."""
    example = example_of(job)
    prefix = example.upper() + "_"
    only = {prefix + "KNOB_RANKS": ",".join(map(str, sandbox))}

    def env(**kv):
        return SandboxChange(env=tuple(kv.items())), {
            "all": dataclasses.replace(job, env={**job.env, **kv}),
            "sandbox": dataclasses.replace(job, env={**job.env, **kv, **only})}

    table = {"none": (SandboxChange(), {"all": job})}
    table.update({case: env(**{prefix + knob: "1"}) for case, knob in KNOBS.items()})
    args = (*job.args, "--matmul", "float64")
    table["matmul64"] = (SandboxChange(args=args), {
        "all": dataclasses.replace(job, args=args),
        "sandbox": dataclasses.replace(job, env={**job.env, prefix + "MATMUL": "float64", **only})})
    return {case: table[case] for case in EXAMPLE_CASES[example]}


def compute_ms(nodes, skip: int) -> float:
    """Median over the measured steps of the time a rank spent in its compute spans per step: how
    fast its own work ran, apart from any wait on other ranks."""
    per_step: dict[int, int] = {}
    for n in nodes:
        if n.kind is NodeKind.COMPUTE and n.step >= skip and n.duration_ns > 0:
            per_step[n.step] = per_step.get(n.step, 0) + n.duration_ns
    return statistics.median(per_step.values()) / 1e6 if per_step else float("nan")


def real_run(job: JobConfig, run: Path, sandbox: tuple[int, ...], inline: bool) -> dict:
    graph = record_job(job, run, timeout_s=600, memory_pass=not inline)
    skip = job.iterations.warmup
    s = [graph.summaries[r] for r in sandbox]
    return {"p50_ms": statistics.fmean(statistics.median(x.step_times_ns[skip:]) / 1e6 for x in s),
            "compute_ms": statistics.fmean(compute_ms(graph.nodes[r], skip) for r in sandbox),
            "measured_peak_bytes": [x.measured_peak_memory_bytes for x in s],
            "peak_bytes": [x.peak_memory_bytes for x in s]}


def emulation(run: Path, change: SandboxChange, out: Path, sandbox: tuple[int, ...], inline: bool) -> dict:
    rep = emulate_and_report(run, EmulateOptions(ranks=sandbox, change=change, timeout_s=600, out_dir=str(out),
                                                 memory="inline" if inline else "pass"))
    rows = [rep.data["ranks"][str(r)] for r in sandbox]
    skip = rep.data["skip_steps"]
    records = []
    for r in sandbox:
        with record_path(rep.out_dir, r).open("rb") as f:
            records.append(pickle.load(f))  # noqa: S301 - prism's own worker output
    return {"p50_ms": statistics.fmean(row["p50_ms"] for row in rows),
            "compute_ms": statistics.fmean(compute_ms(rec.nodes, skip) for rec in records),
            "measured_peak_bytes": [row["measured_peak_memory_bytes"] for row in rows],
            "peak_bytes": [row["peak_memory_bytes"] for row in rows],
            "diverged_ops": sum(len(row.get("diverged_ops") or []) for row in rows)}


def core_halves() -> tuple[set[int], set[int]]:
    """This process's CPUs split into two halves of whole physical cores (hyperthread siblings stay
    together), so the two sides of a duet do not share a core."""
    cpus = sorted(os.sched_getaffinity(0))
    cores: dict[str, set[int]] = {}
    for c in cpus:
        sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        key = sib.read_text().strip() if sib.is_file() else str(c)
        cores.setdefault(key, set()).add(c)
    groups = list(cores.values())
    if len(groups) < 2:
        raise SystemExit(f"--duet needs at least 2 physical cores; this process has CPUs {cpus}")
    half = len(groups) // 2
    return set().union(*groups[:half]), set().union(*groups[half:])


def _spawn(spec: dict, cpus: set[int], tmp: Path) -> tuple[subprocess.Popen, Path]:
    """This script as a child (``--child``) pinned to ``cpus``; prism's workers inherit the mask."""
    path = tmp / f"child-{time.monotonic_ns()}.pkl"
    result = path.with_suffix(".json")
    path.write_bytes(pickle.dumps({**spec, "result": str(result)}))
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(path)],
                            preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return proc, result


def _collect(proc: subprocess.Popen, result: Path) -> dict:
    if proc.wait() != 0:
        raise SystemExit(f"a duet child failed (exit {proc.returncode}); its output is above")
    return json.loads(result.read_text())


def child(spec_path: str) -> None:
    spec = pickle.loads(Path(spec_path).read_bytes())  # noqa: S301 - written by the parent above
    logging.basicConfig(level=logging.WARNING)
    if spec["op"] == "real":
        out = real_run(spec["job"], Path(spec["run"]), spec["sandbox"], spec["inline"])
    elif spec["op"] == "emulate":
        out = emulation(Path(spec["run"]), spec["change"], Path(spec["out"]), spec["sandbox"], spec["inline"])
    else:
        calibrate_run(spec["run"], slice_size=2, repeats=spec["repeats"], timeout_s=600)
        out = {}
    Path(spec["result"]).write_text(json.dumps(out))


def duet_case(name: str, change: SandboxChange, real_job: JobConfig, run: Path, base: Path, sandbox, inline: bool,
              repeats: int, calibration_repeats: int, halves, console: Console) -> dict:
    """Re-calibrate beside looping real runs, then ``repeats`` emulations each beside a real run."""
    real_cpus, prism_cpus = halves
    common = {"sandbox": sandbox, "inline": inline}
    tmp = base / "duet"
    tmp.mkdir(parents=True, exist_ok=True)

    def real_spec(tag: str) -> dict:
        return {"op": "real", "job": real_job, "run": str(base / f"real-{name}-{tag}"), **common}

    cal, cal_res = _spawn({"op": "calibrate", "run": str(run), "repeats": calibration_repeats}, prism_cpus, tmp)
    beside_calibration = []
    while cal.poll() is None:
        beside_calibration.append(_collect(*_spawn(real_spec(f"c{len(beside_calibration)}"), real_cpus, tmp)))
    _collect(cal, cal_res)
    pairs = []
    for i in range(repeats):
        emu = _spawn({"op": "emulate", "run": str(run), "change": change, "out": str(base / f"emu-{name}-{i}"),
                      **common}, prism_cpus, tmp)
        real = _spawn(real_spec(str(i)), real_cpus, tmp)
        pairs.append((_collect(*real), _collect(*emu)))
        console.print(f"{name} duet #{i}: real {pairs[-1][0]['p50_ms']:.1f} ms beside emulated "
                      f"{pairs[-1][1]['p50_ms']:.1f} ms")
    return {"beside_calibration_ms": [r["p50_ms"] for r in beside_calibration],
            "reals": [r for r, _ in pairs], "emus": [e for _, e in pairs],
            "paired_error": statistics.median(e["p50_ms"] / r["p50_ms"] - 1 for r, e in pairs),
            "real_cpus": sorted(real_cpus), "prism_cpus": sorted(prism_cpus)}


def peak_verdict(reals: list[dict], emus: list[dict], key: str) -> dict:
    """Equal in bytes to every real run, or inside the real runs' spread (per sandbox rank)."""
    real = [r[key] for r in reals]
    emu = [e[key] for e in emus]
    lo = [min(v[i] for v in real) for i in range(len(real[0]))]
    hi = [max(v[i] for v in real) for i in range(len(real[0]))]
    return {"real": real, "emulated": emu, "equal": all(v == real[0] for v in real + emu),
            "in_spread": all(lo[i] <= v[i] <= hi[i] for v in emu for i in range(len(v)))}


def _shown(path: Path) -> str:
    """The job's path relative to the checkout when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def write_summary(out: Path, job_path: Path, job: JobConfig, sandbox: tuple[int, ...], repeats: int, settings: dict,
                  results: dict) -> dict:
    # the question the emulation answers is "rank(s) S changed, the rest as recorded": the real run
    # with the change on the sandbox ranks only; for "none" that is the unchanged job
    primary = {name: r["real"]["sandbox"] if "sandbox" in r["real"] else r["real"]["all"]
               for name, r in results.items()}
    summary = {"benchmark": "config_whatif", "job": _shown(job_path), "sandbox": list(sandbox),
               "world_size": job.world_size, "args": list(job.args), "repeats": repeats, "settings": settings,
               "cpus": os.cpu_count(), "target_abs_error": TARGET, "cases": results,
               "time_met_sandbox_only": all(x["time_met"] for x in primary.values()),
               "time_met_all_ranks": all(r["real"]["all"]["time_met"] for r in results.values() if "all" in r["real"]),
               "memory_met": all(x[k]["equal"] or x[k]["in_spread"] for r in results.values()
                                 for x in r["real"].values() for k in ("measured_peak", "whole_run_peak"))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", type=Path, default=JOB,
                   help="the job (examples/ddp with its DDP_* knobs, or examples/fsdp2 with FSDP2_*); "
                        "tests/assets/jobs/{ddp,fsdp2}_cfg_sleep/job.yaml have sleep compute, whose time the "
                        "host's cores do not move")
    p.add_argument("--cases", default=None, help="comma-separated (default: every case the job's example has: "
                   + "; ".join(f"{e}: {','.join(c)}" for e, c in EXAMPLE_CASES.items()) + ")")
    p.add_argument("--ranks", default="1", help="sandbox ranks")
    p.add_argument("--repeats", type=int, default=3, help="real runs and emulations per case")
    p.add_argument("--calibration-repeats", type=int, default=1,
                   help="takes of the calibration slice (each node keeps its shortest)")
    p.add_argument("--memory-inline", action="store_true",
                   help="track the peaks in the timed runs themselves, one run each (default: a separate "
                        "untimed run of each real run and emulation). The tracker costs ~10 us per aten op on the "
                        "script's thread: fsdp2's ~1,050 ops per step made its real runs 15-20 %% slower on 16 "
                        "cores, while the calibration slices that time the vranks run untracked")
    p.add_argument("--duet", action="store_true",
                   help="real runs and prism side by side on two halves of the cores, at the same time "
                        "(module docstring); compares with the real run of the change on the sandbox ranks only")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--keep", default=None, help="keep the run directories here")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "config_whatif.json"))
    ns = p.parse_args()
    if ns.child:
        return child(ns.child)
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    sandbox = tuple(int(r) for r in ns.ranks.split(","))
    job = load_job(ns.job)
    table = cases(job, sandbox)
    names = ns.cases.split(",") if ns.cases else list(table)
    if unknown := [n for n in names if n not in table]:
        raise SystemExit(f"--cases: {', '.join(unknown)} not among {job.name}'s cases ({', '.join(table)})")
    results = {}
    settings = {"calibration_repeats": ns.calibration_repeats, "memory": "inline" if ns.memory_inline else "pass",
                "design": "duet" if ns.duet else "alternated"}
    halves = core_halves() if ns.duet else None
    with tempfile.TemporaryDirectory(prefix="prism-cfgwhatif-") as tmp:
        base = Path(ns.keep or tmp)
        run = base / "unchanged"
        inline = ns.memory_inline
        recorded = real_run(job, run, sandbox, inline)
        calibrate_run(run, slice_size=2, repeats=ns.calibration_repeats, timeout_s=600)
        for name in names:
            change, real_jobs = table[name]
            load = [os.getloadavg()[0]]
            duet = None
            if ns.duet:
                variant = "sandbox" if "sandbox" in real_jobs else "all"
                duet = duet_case(name, change, real_jobs[variant], run, base, sandbox, inline, ns.repeats,
                                 ns.calibration_repeats, halves, console)
                real_jobs = {variant: real_jobs[variant]}
            reals: dict[str, list[dict]] = {v: ([recorded] if name == "none" and not duet else [])
                                            for v in real_jobs}
            emus: list[dict] = []
            if duet:
                reals[variant], emus = duet.pop("reals"), duet.pop("emus")
            for i in range(0 if duet else ns.repeats):  # alternated: the host's load drifts
                for variant, real_job in real_jobs.items():
                    if len(reals[variant]) < ns.repeats:
                        reals[variant].append(real_run(real_job, base / f"real-{name}-{variant}-{i}", sandbox, inline))
                emus.append(emulation(run, change, base / f"emu-{name}-{i}", sandbox, inline))
                console.print(f"{name} #{i}: real " + ", ".join(f"{v} {r[-1]['p50_ms']:.1f}" for v, r in reals.items())
                              + f" ms; emulated {emus[-1]['p50_ms']:.1f} ms")
            load.append(os.getloadavg()[0])
            emu_ms = statistics.median(e["p50_ms"] for e in emus)
            res: dict = {"change": change.describe(), "emulated_ms": [e["p50_ms"] for e in emus],
                         "emulated_median_ms": emu_ms,
                         "emulated_compute_ms": statistics.median(e["compute_ms"] for e in emus),
                         "diverged_ops": [e["diverged_ops"] for e in emus],
                         "load_average": load, "real": {}}
            if duet:
                res["duet"] = duet
            for variant, runs in reals.items():
                real_ms = statistics.median(r["p50_ms"] for r in runs)
                res["real"][variant] = {
                    "ms": [r["p50_ms"] for r in runs], "median_ms": real_ms, "error": (emu_ms - real_ms) / real_ms,
                    "compute_ms": statistics.median(r["compute_ms"] for r in runs),
                    # the real runs' own error: the largest distance of one run from the median of
                    # the others (None under three runs); a time error inside it is not shown
                    "real_spread": (sp.mean_abs_rel_error if (sp := run_spread([[r["p50_ms"]] for r in runs], 0)) else None),
                    # a duet compares each emulation with the real run beside it
                    "time_met": (abs(duet["paired_error"]) if duet else abs(emu_ms - real_ms) / real_ms) <= TARGET,
                    "measured_peak": peak_verdict(runs, emus, "measured_peak_bytes"),
                    "whole_run_peak": peak_verdict(runs, emus, "peak_bytes")}
            results[name] = res
            write_summary(Path(ns.out), ns.job, job, sandbox, ns.repeats, settings, results)  # a cut-short run keeps its cases
    out_table = Table(title=f"config what-ifs on ranks {list(sandbox)} of {job.name} (W={job.world_size}), "
                            "from the unchanged recording; real runs with the change on every rank / on the "
                            "sandbox ranks only")
    for c in ("change", "real ms all / sandbox", "emulated ms", "error all / sandbox",
              "measured peak real = emulated B", "whole-run peak", "load"):
        out_table.add_column(c, justify="right")

    def verdict(v):
        return "equal" if v["equal"] else "in spread" if v["in_spread"] else "DIFFERS"

    for name, r in results.items():
        rv = r["real"]
        out_table.add_row(name, " / ".join(f"{x['median_ms']:.1f}" for x in rv.values()),
                          f"{r['emulated_median_ms']:.1f}",
                          " / ".join(f"{x['error'] * 100:+.1f} %" for x in rv.values())
                          + (f" (paired {r['duet']['paired_error'] * 100:+.1f} %)" if "duet" in r else ""),
                          f"{next(iter(rv.values()))['measured_peak']['emulated'][0][0]:,} ("
                          + ", ".join(verdict(x["measured_peak"]) for x in rv.values()) + ")",
                          ", ".join(verdict(x["whole_run_peak"]) for x in rv.values()),
                          f"{r['load_average'][0]:.1f}–{r['load_average'][1]:.1f}")
    console.print(out_table)
    summary = write_summary(Path(ns.out), ns.job, job, sandbox, ns.repeats, settings, results)
    out = Path(ns.out)
    console.print(f"{out}: time {'met' if summary['time_met_sandbox_only'] else 'NOT met'} (sandbox only), "
                  f"{'met' if summary['time_met_all_ranks'] else 'NOT met'} (every rank), "
                  f"memory {'met' if summary['memory_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
