"""What-if fidelity (issue #13): emulate a change of the sandbox ranks' program from the UNCHANGED
recording, and compare with a real run of the changed job.

The job (tests/assets/jobs/whatif_pipe): a 2-stage 1F1B pipeline inside 2 DP replicas, W=4, sleep
compute (fwd 10 / bwd 20 ms per microbatch, 4 microbatches), replica 1 1.5x slower. It is recorded
and calibrated unchanged. The change: ``PIPE_STAGE_SCALE=1:F`` (stage 1, ranks 1 and 3, computes F
times as long) given only to the sandbox ranks {1, 3} (``prism emulate --env``), for F = 0.5 (2x
faster) and 2 (2x slower). For each: ``--real-repeats`` real runs with the change (all ranks real,
gloo; every rank gets the variable, only stage 1 reads it), ``--repeats`` emulations on the
co-simulation clock that follows the sandbox (``cosim``, the default) and, for comparison, on the
earlier per-vrank offset clock (``offset``), the same number of times. Iteration time: the mean of the measured steps of the
sandbox ranks, medians over repeats (the two clocks alternated). Also the unchanged emulation
beside the unchanged real run. The host's 1-minute load average is saved with each change.

    python bench/whatif.py                    # → bench/results/whatif.json
    python bench/whatif.py --repeats 1 --real-repeats 1 --factors 0.5
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

from prism.core.config import load_job
from prism.core.whatif import SandboxChange
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests/assets/jobs/whatif_pipe/job.yaml"
SANDBOX = (1, 3)
VAR = "PIPE_STAGE_SCALE"


def job_with(env: dict | None = None, steps: int | None = None):
    job = load_job(JOB)
    if steps is not None:
        args = list(job.args)
        args[args.index("--steps") + 1] = str(steps)
        job = dataclasses.replace(job, args=tuple(args),
                                  iterations=dataclasses.replace(job.iterations, measured=steps - 1))
    return dataclasses.replace(job, env=dict(env or {}))


def real_ms(job, run: Path, sandbox=SANDBOX) -> float:
    """Mean measured step of the sandbox ranks in a real run of ``job``."""
    graph = record_job(job, run, timeout_s=300)
    skip = job.iterations.warmup
    return statistics.fmean(statistics.fmean(graph.summaries[r].step_times_ns[skip:]) / 1e6 for r in sandbox)


def emulated_ms(run: Path, change: SandboxChange, clock: str, out: Path, sandbox=SANDBOX) -> tuple[float, dict]:
    rep = emulate_and_report(run, EmulateOptions(ranks=sandbox, change=change, clock=clock, timeout_s=300,
                                                 out_dir=str(out)))
    rows = rep.data["ranks"]
    return statistics.fmean(rows[str(r)]["mean_ms"] for r in sandbox), rep.data


def rel(a: float, b: float) -> float:
    return (a - b) / b


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--factors", default="0.5,2", help="stage-1 compute factors to try")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="try this change instead of the factors (repeatable: one change each), e.g. "
                        "PIPE_SYNC_SEND_STAGE=1 (stage 1 without P2P overlap)")
    p.add_argument("--ranks", default="1,3", help="sandbox ranks (default: stage 1)")
    p.add_argument("--steps", type=int, default=6, help="steps per run (1 warm-up)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--real-repeats", type=int, default=3)
    p.add_argument("--keep", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "whatif.json"))
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    sandbox = tuple(int(r) for r in ns.ranks.split(","))
    results = []
    with tempfile.TemporaryDirectory(prefix="prism-whatif-") as tmp:
        base = Path(ns.keep or tmp)
        run = base / "unchanged"
        unchanged_real = real_ms(job_with(steps=ns.steps), run, sandbox)
        calibrate_run(run, slice_size=2, timeout_s=300)
        base_emu, _ = emulated_ms(run, SandboxChange(), "cosim", base / "emu-unchanged", sandbox)
        console.print(f"unchanged: real {unchanged_real:.1f} ms, emulated {base_emu:.1f} ms "
                      f"({rel(base_emu, unchanged_real) * 100:+.2f} %)")
        changes = ([(i, dict([kv.split("=", 1)])) for i, kv in enumerate(ns.env)] if ns.env else
                   [(float(x), {VAR: f"1:{float(x):g}"}) for x in ns.factors.split(",")])
        for f, env in changes:
            reals = [real_ms(job_with(env, ns.steps), base / f"real-{f:g}-{i}", sandbox) for i in range(ns.real_repeats)]
            change = SandboxChange(env=tuple(env.items()))
            emus: dict[str, list[float]] = {"cosim": [], "offset": []}
            for i in range(ns.repeats):  # alternated: the host's load drifts
                for clock in emus:
                    emus[clock].append(emulated_ms(run, change, clock, base / f"emu-{clock}-{f:g}-{i}", sandbox)[0])
            real = statistics.median(reals)
            res = {"factor": f if not ns.env else None, "env": env, "real_ms": reals, "real_median_ms": real,
                   "emulated_ms": emus["cosim"], "emulated_median_ms": statistics.median(emus["cosim"]),
                   "error": rel(statistics.median(emus["cosim"]), real),
                   "offset_clock_ms": emus["offset"], "offset_clock_median_ms": statistics.median(emus["offset"]),
                   "offset_clock_error": rel(statistics.median(emus["offset"]), real),
                   "load_average": os.getloadavg()[0]}
            results.append(res)
    table = Table(title=f"what-if on ranks {list(sandbox)}, W=4, from the unchanged recording")
    for c in ("change", "real ms (median)", "emulated ms", "error", "offset clock ms", "offset clock error"):
        table.add_column(c, justify="right")
    for r in results:
        table.add_row(" ".join(f"{k}={v}" for k, v in r["env"].items()), f"{r['real_median_ms']:.1f}", f"{r['emulated_median_ms']:.1f}",
                      f"{r['error'] * 100:+.2f} %", f"{r['offset_clock_median_ms']:.1f}",
                      f"{r['offset_clock_error'] * 100:+.2f} %")
    console.print(table)
    summary = {"benchmark": "whatif", "job": str(JOB.relative_to(ROOT)), "sandbox": list(sandbox),
               "steps": ns.steps, "target_abs_error": 0.02,
               "unchanged": {"real_ms": unchanged_real, "emulated_ms": base_emu,
                             "error": rel(base_emu, unchanged_real)},
               "changes": results, "met": all(abs(r["error"]) <= 0.02 for r in results)}
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    console.print(f"{out}: target {'met' if summary['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
