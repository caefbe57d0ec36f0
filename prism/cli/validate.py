"""Validate prism against the real job (DESIGN §10): record the real run (all ranks, gloo), capture
and calibrate, emulate the chosen sandbox ranks, and compare them with the real run — comm
signature, losses, iteration time, peak memory — beside the free tool: the same rank alone under
PyTorch's fake process group (``prism walk --engine torch-fake``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.core.config import load_job
from prism.core.errors import RankFailedError
from prism.core.ranks import parse_rank_ranges
from prism.graph.compare import match_ratio
from prism.sandbox.recording import record_job, walk_rank
from prism.vrank_replayer import EmulateOptions, captured_losses
from prism.vrank_replayer.calibrate_run import calibrate_run, ensure_recorded
from prism.vrank_replayer.emulate_report import emulate_and_report
from prism.vrank_replayer.fidelity import losses_bitwise_equal, losses_equal, rank_fidelity, step_errors

from . import add_timeout_argument
from .devices import add_device_arguments, device_options

HELP = "record, calibrate and emulate a job, and compare with the real run and PyTorch's fake PG"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job.yaml")
    p.add_argument("--ranks", required=True, help="sandbox ranks, e.g. 2,5")
    p.add_argument("--out", default=None, help="run directory (default: ./validate-<job name>)")
    p.add_argument("--slice-size", type=int, default=2, help="ranks per calibration slice")
    add_timeout_argument(p, default_s=600.0, what="each run (record, capture, each calibration slice, emulate)")
    p.add_argument("--no-torch-fake", action="store_true", help="leave out the fake process group column")
    p.add_argument("--json", dest="json_out", default=None, help="write the comparison as JSON here")
    add_device_arguments(p)


def _torch_fake(job, rank: int, real, skip: int, timeout_s: float) -> dict:
    try:
        rec = walk_rank(job, rank, engine="torch-fake", timeout_s=timeout_s)
    except RankFailedError as e:
        lines = e.traceback_text.strip().splitlines()
        return {"status": "crashed", "error": lines[-1] if lines else f"exit code {e.exit_code}"}
    summary = real.summaries.get(rank)
    losses = list(rec.summary.losses)
    real_losses = list(summary.losses) if summary else []
    equal = losses_equal(losses, real_losses)
    t = step_errors([s / 1e6 for s in rec.summary.step_times_ns],
                    [s / 1e6 for s in summary.step_times_ns] if summary else [], skip)
    return {"status": "ran", "signature_match": match_ratio(real.nodes[rank], real.groups, rec.nodes,
                                                            {g.group_id: g for g in rec.groups}),
            "losses_equal": equal, "time": dataclasses.asdict(t),
            "peak_memory_bytes": rec.summary.peak_memory_bytes}


def validate(job_path: str, ranks_text: str, out: str | None, *, slice_size: int, timeout_s: float,
             torch_fake: bool, device: dict | None = None) -> dict:
    job = load_job(job_path)
    ranks = parse_rank_ranges(ranks_text, job.world_size)
    run = Path(out or f"validate-{job.name}")
    skip = job.iterations.warmup
    real = record_job(job, run, timeout_s=timeout_s)
    cal = calibrate_run(run, slice_size=slice_size, skip_steps=skip, timeout_s=timeout_s, device=device)
    ensure_recorded(run, ranks, timeout_s=timeout_s)
    emu = emulate_and_report(run, EmulateOptions(ranks=ranks, timeout_s=timeout_s, **(device or {})), skip_steps=skip)
    rows = {}
    for r in ranks:
        row = emu.data["ranks"][str(r)]
        fid = rank_fidelity(r, real, emu.nodes[r], emu.groups, losses=row.get("losses", []),
                            steps_ms=row.get("step_ms", []), peak_memory_bytes=row.get("peak_memory_bytes", -1),
                            skip=skip)
        collected = captured_losses(run, r)
        bitwise = collected is not None and losses_bitwise_equal(row.get("losses", []), collected)
        rows[r] = {"prism": {**dataclasses.asdict(fid), "losses_bitwise_collected": bitwise, "oom": row["oom"], "diverged_ops": len(row.get("diverged_ops", [])),
                             "calibrated_ms": cal.report.ranks[r].calibrated_step_ns / 1e6},
                   "torch_fake": _torch_fake(job, r, real, skip, timeout_s) if torch_fake else None}
    return {"job": job.name, "world_size": job.world_size, "sandbox_ranks": list(ranks), "run_dir": str(run),
            "skip_steps": skip, "emulation": str(emu.out_dir), "ranks": rows}


def _pct(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:.2f} %"


def _mib(b) -> str:
    return "—" if b is None or b < 0 else f"{b / 2**20:.3f} MiB"


def print_validation(result: dict, console: Console) -> None:
    table = Table(title=f"validate {result['job']} W={result['world_size']}: sandbox {result['sandbox_ranks']} vs the "
                        f"real run (first {result['skip_steps']} step(s) skipped)", title_justify="left")
    table.add_column("metric")
    for r in result["ranks"]:
        table.add_column(f"prism emulate r{r}", justify="right")
        table.add_column(f"torch fake PG r{r}", justify="right")
    metrics = ["comm signature match", "losses bitwise = collected", "losses equal real", "iteration time error (mean)",
               "iteration time error (max step)", "iteration ms (real)", "peak memory (real)", "peak memory diff"]
    cells = {m: [] for m in metrics}
    for v in result["ranks"].values():
        p, f = v["prism"], v["torch_fake"]
        t = p["time"]
        cells["comm signature match"].append(_pct(p["signature_match"]))
        cells["losses bitwise = collected"].append("yes" if p.get("losses_bitwise_collected") else "no")
        cells["losses equal real"].append("yes" if p["losses_equal"] else f"no (max rel {p['max_loss_rel_diff']:.1e})")
        cells["iteration time error (mean)"].append(f"{t['mean_rel_error'] * 100:+.2f} %")
        cells["iteration time error (max step)"].append(_pct(t["max_rel_error"]))
        cells["iteration ms (real)"].append(f"{t['real_mean_ms']:.2f} (emu {t['mean_ms']:.2f})")
        cells["peak memory (real)"].append(_mib(p["real_peak_memory_bytes"]))
        cells["peak memory diff"].append(_mib(abs(p["peak_memory_bytes"] - p["real_peak_memory_bytes"])))
        if f is None:
            for m in metrics:
                cells[m].append("—")
        elif f["status"] == "crashed":
            cells["comm signature match"].append(f"crashed: {f['error'][:60]}")
            for m in metrics[1:]:
                cells[m].append("—")
        else:
            ft = f["time"]
            cells["comm signature match"].append(_pct(f["signature_match"]))
            cells["losses bitwise = collected"].append("—")
            cells["losses equal real"].append("yes" if f["losses_equal"] else "no (garbage values)")
            cells["iteration time error (mean)"].append(f"{ft['mean_rel_error'] * 100:+.2f} % (no peer waits)")
            cells["iteration time error (max step)"].append(_pct(ft["max_rel_error"]))
            cells["iteration ms (real)"].append(f"(fake {ft['mean_ms']:.2f})")
            cells["peak memory (real)"].append("")
            cells["peak memory diff"].append(_mib(abs(f["peak_memory_bytes"] - p["real_peak_memory_bytes"])))
    for m in metrics:
        table.add_row(m, *cells[m])
    console.print(table)
    console.print(f"run: {result['run_dir']}  emulation: {result['emulation']}")


def run(args: argparse.Namespace) -> int:
    result = validate(args.job, args.ranks, args.out, slice_size=args.slice_size, timeout_s=args.timeout,
                      torch_fake=not args.no_torch_fake, device=device_options(args))
    print_validation(result, Console())
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    return 0
