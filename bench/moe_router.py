"""MoE mock router (issue #13, docs/moe-router.md): balanced vs imbalanced routing on the moe example
(W=8, one EP group of 8, 64 tokens per rank, 3 steps), real run vs emulation.

For each routing (balanced: every br 1; imbalanced: the br statistics of [0.55 … 1.8]): a real run
(all ranks, gloo) with the router, its realised br statistics per step against the requested; a
capture run (recorded values); then the rank with the highest br and the one with the lowest are
emulated (each alone, the other 7 virtual) and their tracked peaks compared with the real run's.
Then a cap between the imbalanced run's highest whole-run peak and the second: the real run stops
with that rank out of memory, its emulation with the same cap too, at the same step and allocation;
the balanced job under the same cap runs to the end.

    python bench/moe_router.py              # → bench/results/moe_router.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from rich.console import Console

from prism.core.balance import br_stats, router_summary
from prism.core.config import job_from_dict
from prism.core.errors import RankOOMError
from prism.graph.io import read_graph
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions, capture_job
from prism.vrank_replayer.emulate_report import emulate_and_report

ROOT = Path(__file__).resolve().parents[1]
SKEWED = [0.55, 0.6, 0.75, 0.9, 1.0, 1.15, 1.25, 1.8]
BALANCED = {"min": 1.0, "max": 1.0, "avg": 1.0, "std": 0.0, "med": 1.0, "skew": 0.0}


def job(br: dict, cap: int = 0):
    return job_from_dict({
        "name": "moe-router", "entrypoint": str(ROOT / "examples/moe/train.py"),
        "args": ["--steps", "3", "--ep", "8", "--tokens", "64"], "world_size": 8,
        "iterations": {"warmup": 1, "measured": 2}, "parallelism": {"dp": 8, "ep": 8},
        "memory_cap_bytes": cap, "moe_router": {"gate": "MoEModel.router", "br": br}})


def rel_errors(realised: dict, target: dict) -> dict:
    return {k: (realised[k] - target[k]) / target[k] if target[k] else realised[k] - target[k] for k in target}


def one(name: str, br: dict, base: Path, console: Console, reuse: bool = False) -> dict:
    run = base / name
    if reuse and (run / "graph" / "real" / "manifest.pb").is_file() and (run / "capture").is_dir():
        graph = read_graph(run / "graph" / "real")
    else:
        graph = record_job(job(br), run, timeout_s=400)
        capture_job(job(br), run, timeout_s=400)
    logs = [json.loads(p.read_text()) for p in sorted((run / "logs").glob("rank-*.moe_router.json"))]
    summary = router_summary(logs)["groups"]["0"]
    measured = {s: row for s, row in summary.items() if int(s) >= 1}
    br_last = summary[max(summary, key=int)]["br"]
    hot, cold = int(max(br_last, key=br_last.get)), int(min(br_last, key=br_last.get))
    ranks = {}
    for r in sorted({hot, cold}):
        rep = emulate_and_report(run, EmulateOptions(ranks=(r,), timeout_s=400), use_timed=False)
        row = rep.data["ranks"][str(r)]
        real = graph.summaries[r]
        ranks[str(r)] = {"br_last_step": br_last[str(r)],
                         "real_measured_peak": real.measured_peak_memory_bytes, "real_run_peak": real.peak_memory_bytes,
                         "emulated_measured_peak": row["measured_peak_memory_bytes"],
                         "emulated_run_peak": row["peak_memory_bytes"],
                         "equal": (row["measured_peak_memory_bytes"], row["peak_memory_bytes"])
                         == (real.measured_peak_memory_bytes, real.peak_memory_bytes)}
    res = {"br_requested": br, "realised_per_step": summary,
           "max_rel_error": max(abs(v) for row in summary.values()
                                for k, v in rel_errors(row["stats"], br).items() if br[k]),
           "real_peaks": {str(r): s.peak_memory_bytes for r, s in graph.summaries.items()},
           "real_measured_peaks": {str(r): s.measured_peak_memory_bytes for r, s in graph.summaries.items()},
           "emulated": ranks, "hot": hot, "cold": cold}
    console.print(f"{name}: realised br max rel. error {res['max_rel_error'] * 100:.2f} %; "
                  f"peaks real {res['real_measured_peaks']}; emulated {ranks}")
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", default=None)
    p.add_argument("--reuse", action="store_true", help="with --keep: reuse the real and capture runs there")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "moe_router.json"))
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="prism-moe-router-") as tmp:
        base = Path(ns.keep or tmp)
        skewed = br_stats(SKEWED)
        results = {"balanced": one("balanced", BALANCED, base, console, ns.reuse),
                   "imbalanced": one("imbalanced", skewed, base, console, ns.reuse)}
        peaks = results["imbalanced"]["real_peaks"]
        high, second = sorted(set(peaks.values()), reverse=True)[:2]  # ranks may share the top peak
        cap = (high + second) // 2
        top = min((r for r, v in peaks.items() if v == high), key=int)
        oom: dict = {"cap_bytes": cap, "rank": int(top), "ranks_above": sorted(int(r) for r, v in peaks.items() if v > cap),
                     "balanced_max_peak": max(results["balanced"]["real_peaks"].values())}
        try:
            record_job(job(skewed, cap), base / "capped", timeout_s=400)
            oom["real"] = None
        except RankOOMError as e:
            oom["real"] = [{k: getattr(o, k) for k in ("rank", "step", "requested_bytes", "in_use_bytes")}
                           for o in e.ooms]
        if oom["real"]:  # the rank the real run stopped on (ranks sharing the top peak reach it at other steps)
            top = str(oom["real"][0]["rank"])
        oom["emulated_rank"] = int(top)
        rep = emulate_and_report(base / "imbalanced", EmulateOptions(ranks=(int(top),), timeout_s=400,
                                                                     memory_cap_bytes=cap), use_timed=False)
        o = rep.data["ranks"][top]["oom"]
        oom["emulated"] = {k: o[k] for k in ("step", "requested_bytes", "in_use_bytes")} if o else None
        if oom["balanced_max_peak"] < cap:
            try:
                record_job(job(BALANCED, cap), base / "balanced-capped", timeout_s=400)
                oom["balanced_under_cap"] = "finished"
            except RankOOMError:
                oom["balanced_under_cap"] = "oom"
        results["oom"] = oom
        console.print(oom)
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "moe_router", **results}, indent=1))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
