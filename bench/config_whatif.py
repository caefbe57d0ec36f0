"""Config what-ifs of PrismLLM's Table 1 (issue #13 item 3): emulate a config change of the sandbox
ranks from the UNCHANGED recording, and compare with real runs of the changed job.

The job (tests/assets/jobs/ddp_cfg): examples/ddp at W=2 (a 4-block MLP, dim 256, hidden 1024,
batch 128, one 25 MB gradient bucket), 6 steps (1 warm-up). It is recorded and calibrated
unchanged; then rank 1 (the sandbox) runs with one change while vrank 0 keeps the recording:

* ``recompute``: activation recomputation (``--env DDP_RECOMPUTE=1``: torch.utils.checkpoint on
  every block);
* ``offload``: activations offloaded to host memory (``--env DDP_OFFLOAD_ACTIVATIONS=1``:
  ``saved_tensors_hooks`` that keep autograd's saved tensors as NumPy copies, outside the tracked
  allocator, and bring them back in the backward);
* ``matmul64``: another compute path (``--args '... --matmul float64'``: every Linear in float64).

The real run of each change applies it to every rank (the job's config changed: both DDP ranks
do the same work, so the step is the changed rank's). Per case: ``--repeats`` real runs and
emulations, alternated (the host's load drifts). Iteration time: per run the median of the
sandbox rank's measured steps (after the warm-up), then the median over repeats. Peak memory: the
tracked peak of the sandbox rank over the measured steps and over the whole run, each run's bytes.
The host's 1-minute load average is saved with each case.

    python bench/config_whatif.py                 # → bench/results/config_whatif.json
    python bench/config_whatif.py --cases recompute --repeats 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.config import JobConfig, load_job
from prism.core.whatif import SandboxChange
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests/assets/jobs/ddp_cfg/job.yaml"
TARGET = 0.03


def cases(job: JobConfig) -> dict[str, tuple[SandboxChange, JobConfig]]:
    """name → (the change as the sandbox gets it, the changed job every rank of a real run runs)."""
    def env(**kv):
        return SandboxChange(env=tuple(kv.items())), dataclasses.replace(job, env={**job.env, **kv})

    args = (*job.args, "--matmul", "float64")
    return {"none": (SandboxChange(), job),
            "recompute": env(DDP_RECOMPUTE="1"),
            "offload": env(DDP_OFFLOAD_ACTIVATIONS="1"),
            "matmul64": (SandboxChange(args=args), dataclasses.replace(job, args=args))}


def real_run(job: JobConfig, run: Path, sandbox: tuple[int, ...]) -> dict:
    graph = record_job(job, run, timeout_s=600)
    skip = job.iterations.warmup
    s = [graph.summaries[r] for r in sandbox]
    return {"p50_ms": statistics.fmean(statistics.median(x.step_times_ns[skip:]) / 1e6 for x in s),
            "measured_peak_bytes": [x.measured_peak_memory_bytes for x in s],
            "peak_bytes": [x.peak_memory_bytes for x in s]}


def emulation(run: Path, change: SandboxChange, out: Path, sandbox: tuple[int, ...]) -> dict:
    rep = emulate_and_report(run, EmulateOptions(ranks=sandbox, change=change, timeout_s=600, out_dir=str(out)))
    rows = [rep.data["ranks"][str(r)] for r in sandbox]
    return {"p50_ms": statistics.fmean(row["p50_ms"] for row in rows),
            "measured_peak_bytes": [row["measured_peak_memory_bytes"] for row in rows],
            "peak_bytes": [row["peak_memory_bytes"] for row in rows],
            "diverged_ops": sum(len(row.get("diverged_ops") or []) for row in rows)}


def peak_verdict(reals: list[dict], emus: list[dict], key: str) -> dict:
    """Equal in bytes to every real run, or inside the real runs' spread (per sandbox rank)."""
    real = [r[key] for r in reals]
    emu = [e[key] for e in emus]
    lo = [min(v[i] for v in real) for i in range(len(real[0]))]
    hi = [max(v[i] for v in real) for i in range(len(real[0]))]
    return {"real": real, "emulated": emu, "equal": all(v == real[0] for v in real + emu),
            "in_spread": all(lo[i] <= v[i] <= hi[i] for v in emu for i in range(len(v)))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="none,recompute,offload,matmul64")
    p.add_argument("--ranks", default="1", help="sandbox ranks")
    p.add_argument("--repeats", type=int, default=3, help="real runs and emulations per case")
    p.add_argument("--keep", default=None, help="keep the run directories here")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "config_whatif.json"))
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    sandbox = tuple(int(r) for r in ns.ranks.split(","))
    job = load_job(JOB)
    table = cases(job)
    results = {}
    with tempfile.TemporaryDirectory(prefix="prism-cfgwhatif-") as tmp:
        base = Path(ns.keep or tmp)
        run = base / "unchanged"
        recorded = real_run(job, run, sandbox)
        calibrate_run(run, slice_size=2, timeout_s=600)
        for name in ns.cases.split(","):
            change, changed_job = table[name]
            load = [os.getloadavg()[0]]
            reals, emus = ([recorded] if name == "none" else []), []
            for i in range(ns.repeats):  # alternated: the host's load drifts
                if len(reals) < ns.repeats:
                    reals.append(real_run(changed_job, base / f"real-{name}-{i}", sandbox))
                emus.append(emulation(run, change, base / f"emu-{name}-{i}", sandbox))
                console.print(f"{name} #{i}: real {reals[-1]['p50_ms']:.1f} ms, emulated {emus[-1]['p50_ms']:.1f} ms")
            load.append(os.getloadavg()[0])
            real_ms = statistics.median(r["p50_ms"] for r in reals)
            emu_ms = statistics.median(e["p50_ms"] for e in emus)
            results[name] = {
                "change": change.describe(), "real_ms": [r["p50_ms"] for r in reals], "real_median_ms": real_ms,
                "emulated_ms": [e["p50_ms"] for e in emus], "emulated_median_ms": emu_ms,
                "error": (emu_ms - real_ms) / real_ms, "time_met": abs(emu_ms - real_ms) <= TARGET * real_ms,
                "measured_peak": peak_verdict(reals, emus, "measured_peak_bytes"),
                "whole_run_peak": peak_verdict(reals, emus, "peak_bytes"),
                "diverged_ops": [e["diverged_ops"] for e in emus], "load_average": load}
    out_table = Table(title=f"config what-ifs on ranks {list(sandbox)} of {job.name} (W={job.world_size}), "
                            "from the unchanged recording")
    for c in ("change", "real ms", "emulated ms", "error", "measured peak real / emulated B", "whole-run peak",
              "load"):
        out_table.add_column(c, justify="right")
    for name, r in results.items():
        mp, wp = r["measured_peak"], r["whole_run_peak"]
        out_table.add_row(name, f"{r['real_median_ms']:.1f}", f"{r['emulated_median_ms']:.1f}",
                          f"{r['error'] * 100:+.2f} %",
                          f"{mp['real'][0][0]:,} / {mp['emulated'][0][0]:,} "
                          f"({'equal' if mp['equal'] else 'in spread' if mp['in_spread'] else 'OUT'})",
                          "equal" if wp["equal"] else "in spread" if wp["in_spread"] else "OUT",
                          f"{r['load_average'][0]:.1f}–{r['load_average'][1]:.1f}")
    console.print(out_table)
    summary = {"benchmark": "config_whatif", "job": str(JOB.relative_to(ROOT)), "sandbox": list(sandbox),
               "world_size": job.world_size, "args": list(job.args), "repeats": ns.repeats,
               "real_runs_change": "every rank", "target_abs_error": TARGET, "cases": results,
               "time_met": all(r["time_met"] for r in results.values()),
               "memory_met": all(r[k]["equal"] or r[k]["in_spread"] for r in results.values()
                                 for k in ("measured_peak", "whole_run_peak"))}
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    console.print(f"{out}: time {'met' if summary['time_met'] else 'NOT met'}, "
                  f"memory {'met' if summary['memory_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
