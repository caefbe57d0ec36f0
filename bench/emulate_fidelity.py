"""prism emulate vs a real run: iteration time of the sandbox ranks.

The synthetic timing job (sleep compute, dp x pp 1F1B, 8 microbatches, one slow stage and one
slow replica) is recorded for real (all W ranks, gloo), captured once (recorded data), calibrated
slice by slice (S = 2, ``prism calibrate``) and emulated with 2 sandbox ranks while the other
W − 2 ranks are vranks on the timed co-simulation clock. Reported per sandbox rank and measured
step (the job's warmup steps left out): the emulated iteration time vs the real one (mean and max
relative error), beside the calibrated prediction and an ASAP emulation (vranks answering at once,
no timed graph) for scale.

    python bench/emulate_fidelity.py [--world 8] [--ranks 2,5] [--steps 6] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.config import load_job
from prism.graph.io import read_graph
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.calibrate_run import calibrate_run
from prism.vrank_replayer.emulate_report import emulate_and_report
from prism.vrank_replayer.fidelity import step_errors

ROOT = Path(__file__).resolve().parents[1]


def synthetic_job(world: int, steps: int):
    pp = 4
    dp = world // pp
    job = load_job(ROOT / "examples/synthetic/job.yaml")
    args = ("--steps", str(steps), "--dp", str(dp), "--pp", str(pp), "--microbatches", "8",
            "--slow-stage", "2", "--slow-factor", "1.5", "--slow-replica", "1", "--slow-replica-factor", "1.2")
    return dataclasses.replace(job, args=args, world_size=world, ranks_per_node=world,
                               parallelism=dataclasses.replace(job.parallelism, dp=dp, pp=pp))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--ranks", default="2,5")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--keep", default=None, help="run directory to keep (default: a temporary one)")
    p.add_argument("--reuse", action="store_true", help="with --keep: reuse its real run and timed graph")
    p.add_argument("--out", default=None)
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ranks = tuple(int(r) for r in ns.ranks.split(","))
    job = synthetic_job(ns.world, ns.steps)
    skip = job.iterations.warmup
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        run = Path(ns.keep or tmp)
        t0 = time.time()
        reuse = ns.reuse and (run / "graph" / "timed").is_dir()
        real = read_graph(run / "graph" / "real") if reuse else record_job(job, run)
        t_record = time.time() - t0
        t0 = time.time()
        num_slices = len(list((run / "calibration").glob("slice-*"))) if reuse else \
            len(calibrate_run(run, slice_size=2, skip_steps=skip).slices)
        t_cal = time.time() - t0
        timed = read_graph(run / "graph" / "timed")
        t0 = time.time()
        emu = emulate_and_report(run, EmulateOptions(ranks=ranks), skip_steps=skip)
        t_emu = time.time() - t0
        asap = emulate_and_report(run, EmulateOptions(ranks=ranks), use_timed=False, skip_steps=skip)
    rows = {}
    for r in ranks:
        real_ms = [s / 1e6 for s in real.summaries[r].step_times_ns]
        ends = [n.start_ns for n in timed.nodes[r] if n.kind.value == "MARK" and n.mark == "step_end"]
        pred_ms = [(b - a) / 1e6 for a, b in zip([0, *ends[:-1]], ends)]
        rows[r] = {
            "real_step_ms": real_ms,
            "emulated": dataclasses.asdict(step_errors(emu.data["ranks"][str(r)]["step_ms"], real_ms, skip)),
            "emulated_step_ms": emu.data["ranks"][str(r)]["step_ms"],
            "calibrated_prediction": dataclasses.asdict(step_errors(pred_ms, real_ms, skip)),
            "asap_emulation": dataclasses.asdict(step_errors(asap.data["ranks"][str(r)]["step_ms"], real_ms, skip)),
        }
    summary = {
        "benchmark": "emulate_fidelity", "world_size": job.world_size, "sandbox_ranks": list(ranks),
        "args": list(job.args), "skip_steps": skip, "slices": num_slices,
        "wall_s": {"record": t_record, "calibrate": t_cal, "emulate": t_emu},
        "mean_abs_rel_error": max(abs(v["emulated"]["mean_rel_error"]) for v in rows.values()),
        "max_step_rel_error": max(v["emulated"]["max_rel_error"] for v in rows.values()),
        "ranks": rows,
    }
    table = Table(title=f"emulate vs real, synthetic W={job.world_size} (dp×pp={job.parallelism.dp}×4), sandbox "
                        f"{list(ranks)}, {ns.steps - skip} measured steps", title_justify="left")
    for col in ("rank", "real ms", "emulated ms", "mean err", "max step err", "calibrated ms", "cal. err",
                "ASAP emul. ms", "ASAP err"):
        table.add_column(col, justify="right")
    for r, v in rows.items():
        e, c, a = v["emulated"], v["calibrated_prediction"], v["asap_emulation"]
        table.add_row(str(r), f"{e['real_mean_ms']:.1f}", f"{e['mean_ms']:.1f}", f"{e['mean_rel_error'] * 100:+.2f} %",
                      f"{e['max_rel_error'] * 100:.2f} %", f"{c['mean_ms']:.1f}", f"{c['mean_rel_error'] * 100:+.2f} %",
                      f"{a['mean_ms']:.1f}", f"{a['mean_rel_error'] * 100:+.2f} %")
    Console().print(table)
    text = json.dumps(summary, indent=2)
    if ns.out:
        Path(ns.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
