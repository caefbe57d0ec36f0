"""`prism replay` figures (RankLens §V-C/D/E): timing accuracy, anomaly reproduction, overlap tuning.

1. timing: record the synthetic pipeline (sleep compute, dp 2 x pp 2, 1F1B, 8 microbatches), then
   replay every rank alone with its recorded durations, and with 30 % of them withheld and estimated
   from the other records; mean iteration time after the warmup step against the recorded one.
2. anomaly: examples/anomaly, a normal and a faulty (rank 1 NaN) real run with payloads; rank 0
   replayed with each run's values; NaN positions and bitwise equality of the finite elements.
3. overlap: examples/overlap, one trace of the early-wait schedule replayed with the early and the
   deferred wait, and real runs of both schedules (alternated; per-run median step, median of
   --repeats runs).

A loaded host runs the script's own compute slower or faster than when it was recorded; the
timing rows also give the error with that drift taken out (``compute_adjusted``).

    python bench/replay.py [--repeats 3] [--out bench/results/replay.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.sandbox.replaying import replay_rank

ROOT = Path(__file__).resolve().parents[1]
SYNTH_ARGS = ("--steps", "6", "--dp", "2", "--pp", "2", "--microbatches", "8", "--fwd-ms", "10", "--bwd-ms", "20")
OVERLAP_ARGS = ("--steps", "8", "--a-ms", "20", "--b-ms", "30", "--grad-bytes", str(16 << 20))


def _median_ms(times, skip):
    return statistics.median(times[skip:]) / 1e6


def timing(tmp: Path) -> dict:
    job = load_job(ROOT / "examples/synthetic/job.yaml")
    job = dataclasses.replace(job, args=SYNTH_ARGS, world_size=4, ranks_per_node=4,
                              parallelism=dataclasses.replace(job.parallelism, dp=2, pp=2))
    run = tmp / "synthetic"
    record_job(job, run)
    rows = {}
    for rank in range(job.world_size):
        rec = replay_rank(run, rank)
        est = replay_rank(run, rank, withhold=0.3, seed=rank)
        rows[rank] = {"recorded_ms": rec.recorded_mean_ns / 1e6, "replayed_ms": rec.replayed_mean_ns / 1e6,
                      "error": rec.error, "withheld_replayed_ms": est.replayed_mean_ns / 1e6,
                      "withheld_error": est.error,
                      "compute_adjusted_error": rec.compute_adjusted_error,
                      "withheld_compute_adjusted_error": est.compute_adjusted_error,
                      "withheld_vs_recorded_replay": est.replayed_mean_ns / rec.replayed_mean_ns - 1}
        print(f"rank {rank}: recorded {rows[rank]['recorded_ms']:.2f} ms, replayed {rows[rank]['replayed_ms']:.2f} "
              f"({rec.error:+.2%}; compute-adjusted {rows[rank]['compute_adjusted_error']:+.2%}), 30 % estimated "
              f"{rows[rank]['withheld_replayed_ms']:.2f} ({est.error:+.2%}; compute-adjusted "
              f"{rows[rank]['withheld_compute_adjusted_error']:+.2%})", flush=True)
    return {"args": list(SYNTH_ARGS), "world_size": 4, "ranks": rows,
            "mean_abs_error": statistics.fmean(abs(r["error"]) for r in rows.values()),
            "max_abs_error": max(abs(r["error"]) for r in rows.values()),
            "withheld_mean_abs_error": statistics.fmean(abs(r["withheld_error"]) for r in rows.values()),
            "withheld_max_abs_error": max(abs(r["withheld_error"]) for r in rows.values()),
            "compute_adjusted_mean_abs_error": statistics.fmean(
                abs(r["compute_adjusted_error"]) for r in rows.values()),
            "withheld_compute_adjusted_mean_abs_error": statistics.fmean(
                abs(r["withheld_compute_adjusted_error"]) for r in rows.values())}


def anomaly(tmp: Path) -> dict:
    base = load_job(ROOT / "examples/anomaly/job.yaml")
    out = {}
    for name, nan_rank in (("normal", -1), ("faulty", 1)):
        dump = tmp / f"dump-{name}"
        job = dataclasses.replace(base, args=("--steps", "1", "--nan-rank", str(nan_rank), "--dump", str(dump)))
        record_job(job, tmp / name, payloads=True)
        real = torch.load(dump / "rank-0.pt")[0]
        replay_rank(tmp / name, 0, values=True, timing="none")
        replayed = torch.load(dump / "rank-0.pt")[0]
        row = {}
        for key in ("grad", "param"):
            r, e = real[key], replayed[key]
            finite = ~torch.isnan(r)
            row[key] = {"elements": r.numel(), "nan_positions_real": torch.isnan(r).nonzero().flatten().tolist(),
                        "nan_positions_replay": torch.isnan(e).nonzero().flatten().tolist(),
                        "finite_bitwise_equal": int((e[finite].view(torch.int32) == r[finite].view(torch.int32)).sum()),
                        "finite": int(finite.sum())}
        out[name] = row
        print(f"anomaly {name}: {row}", flush=True)
    return out


def overlap(tmp: Path, repeats: int) -> dict:
    base = load_job(ROOT / "examples/overlap/job.yaml")
    skip = 2
    base = dataclasses.replace(base, args=OVERLAP_ARGS)
    deferred_job = dataclasses.replace(base, args=(*OVERLAP_ARGS, "--defer-wait"))
    real = {"early": [], "deferred": []}
    replayed = {"early": [], "deferred": []}
    trace = tmp / "overlap-early"
    for i in range(repeats):
        for name, job in (("early", base), ("deferred", deferred_job)):
            g = record_job(job, trace if (name == "early" and i == 0) else tmp / f"overlap-{name}-{i}")
            real[name].append(_median_ms(g.summaries[0].step_times_ns, skip))
        for name, args in (("early", OVERLAP_ARGS), ("deferred", (*OVERLAP_ARGS, "--defer-wait"))):
            r = replay_rank(trace, 0, script_args=args)
            replayed[name].append(_median_ms(r.step_times_ns, skip))
        print(f"overlap repeat {i}: real {real['early'][-1]:.2f} / {real['deferred'][-1]:.2f} ms, replay "
              f"{replayed['early'][-1]:.2f} / {replayed['deferred'][-1]:.2f} ms", flush=True)
    # per-run medians of the step times, then the median over runs (a loaded host's outlier steps and runs)
    med = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in (("real", real), ("replay", replayed))}
    return {"args": list(OVERLAP_ARGS), "repeats": repeats, "skip_steps": skip, "real_ms": real, "replay_ms": replayed,
            "median_ms": med,
            "reduction_real": 1 - med["real"]["deferred"] / med["real"]["early"],
            "reduction_replay": 1 - med["replay"]["deferred"] / med["replay"]["early"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=("timing", "anomaly", "overlap"), default=None)
    p.add_argument("--out", default=None)
    ns = p.parse_args()
    result = {"benchmark": "replay", "load_average_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="prism-bench-replay-") as tmp:
        tmp = Path(tmp)
        if ns.only in (None, "anomaly"):
            result["anomaly"] = anomaly(tmp)
        if ns.only in (None, "overlap"):
            result["overlap"] = overlap(tmp, ns.repeats)
            o = result["overlap"]
            print(f"overlap: deferring the wait cuts the step by {o['reduction_real']:.1%} (real) and "
                  f"{o['reduction_replay']:.1%} (replay of the early trace)")
        if ns.only in (None, "timing"):
            result["timing"] = timing(tmp)
            t = result["timing"]
            print(f"timing: mean |error| {t['mean_abs_error']:.2%} (max {t['max_abs_error']:.2%}); 30 % estimated: "
                  f"{t['withheld_mean_abs_error']:.2%} (max {t['withheld_max_abs_error']:.2%}); compute-adjusted "
                  f"{t['compute_adjusted_mean_abs_error']:.2%} / {t['withheld_compute_adjusted_mean_abs_error']:.2%}")
    result["load_average_end"] = os.getloadavg()[0]
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
