"""Validate prism against the real job (DESIGN §10): record the real run (all ranks, gloo), capture
and calibrate, emulate the chosen sandbox ranks, and compare them with the real run — comm
signature, losses, iteration time, peak memory — beside the free tool: the same rank alone under
PyTorch's fake process group (``prism walk --engine torch-fake``).

Peak memory comes in two kinds (the measured steps', the whole run's). With ``--real-repeats N``
the real job runs N times (the first in RUN, before the calibration; the others in
``RUN/real-repeats/<k>``, between the calibration's rounds of takes and after the emulations, so that
they sample the same stretch of a drifting host), the iteration times are compared with each step's
median over the N runs (and over the ``--emulation-repeats`` emulations), and each peak is compared with the real spread: it must lie in it, and
equal it where the real runs agree; a peak on which the real runs disagree is reported as
timing-dependent. From three real runs on,
the table also shows how far the real runs' iteration times lie from each other (each against the
others' per-step median, ``fidelity.run_spread``): an emulated error inside it cannot be told apart
from the real job's own variation."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.calibration import DEFAULT_MERGE, MERGES
from prism.core.config import load_job
from prism.core.errors import PrismError, RankFailedError, crash_site
from prism.core.host_speed import probe_ms
from prism.core.isolation import outside_writes
from prism.core.ranks import parse_rank_ranges
from prism.core.strict_json import nonfinite_as_null
from prism.graph.compare import match_ratio
from prism.sandbox.recording import record_job, walk_rank
from prism.vrank_replayer import EmulateOptions, captured_losses
from prism.vrank_replayer.calibrate_run import calibrate_run, ensure_recorded
from prism.vrank_replayer.emulate_report import emulate_and_report
from prism.vrank_replayer.fidelity import (
    PEAK_KINDS,
    losses_bitwise_equal,
    losses_equal,
    median_steps,
    rank_fidelity,
    run_spread,
    step_errors,
)

from . import add_force_argument, add_timeout_argument, positive_int
from .devices import add_device_arguments, device_options
from .report import print_host_speed, print_no_steps, ranks_without_steps

HELP = "record, calibrate and emulate a job, and compare with the real run and PyTorch's fake PG"
REPEATS_DIR = "real-repeats"
_PEAK_ROWS = {"measured": "peak, measured steps", "run": "peak, whole run"}
_PEAK_NOTES = {"measured": "peak over the measured steps", "run": "whole-run peak"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job.yaml")
    p.add_argument("--ranks", required=True, help="sandbox ranks, e.g. 2,5")
    p.add_argument("--out", default=None, help="run directory (default: ./validate-<job name>)")
    add_force_argument(p)
    p.add_argument("--slice-size", type=positive_int, default=2, help="ranks per calibration slice")
    p.add_argument("--calibration-repeats", type=positive_int, default=1, metavar="N",
                   help="run each calibration slice N times (default 1)")
    p.add_argument("--calibration-merge", choices=MERGES, default=DEFAULT_MERGE,
                   help=f"how each rank's calibration takes become its timing (prism calibrate --merge; default {DEFAULT_MERGE})")
    add_timeout_argument(p, default_s=600.0, what="each run (record, capture, each calibration slice, emulate)")
    p.add_argument("--no-torch-fake", action="store_true", help="leave out the fake process group column")
    p.add_argument("--json", dest="json_out", default=None, help="write the comparison as JSON here")
    add_device_arguments(p)
    p.add_argument("--emulation-repeats", type=positive_int, default=1, metavar="N",
                   help="emulate N times, each followed by one of the further real runs while any are left, and "
                        "compare each step's median over the emulations (default 1; the first emulation gives "
                        "the losses, peaks and ops)")
    p.add_argument("--real-repeats", type=positive_int, default=1, metavar="N",
                   help="run the real job N times (the repeats between the calibration's rounds and after "
                        "the emulation), compare the iteration times with each step's median over them and "
                        "the emulated peaks with their spread (a peak can depend on when peers arrive); default 1")


def _torch_fake(job, rank: int, real, skip: int, timeout_s: float, run: Path) -> dict:
    try:
        rec = walk_rank(job, rank, engine="torch-fake", timeout_s=timeout_s, run_dir=run)
    except RankFailedError as e:
        crash = crash_site(e.traceback_text)
        return {"status": "crashed", "error": crash.error or f"exit code {e.exit_code}", "call": crash.call,
                "site": crash.site}
    summary = real.summaries.get(rank)
    losses = list(rec.summary.losses)
    real_losses = list(summary.losses) if summary else []
    equal = losses_equal(losses, real_losses)
    t = step_errors([s / 1e6 for s in rec.summary.step_times_ns],
                    [s / 1e6 for s in summary.step_times_ns] if summary else [], skip)
    return {"status": "ran", "signature_match": match_ratio(real.nodes[rank], real.groups, rec.nodes,
                                                            {g.group_id: g for g in rec.groups}),
            "losses_equal": equal, "time": dataclasses.asdict(t),
            "peak_memory_bytes": rec.summary.peak_memory_bytes,
            "measured_peak_memory_bytes": rec.summary.measured_peak_memory_bytes}


def validate(job_path: str, ranks_text: str, out: str | None, *, slice_size: int, timeout_s: float,
             torch_fake: bool, device: dict | None = None, real_repeats: int = 1,
             calibration_repeats: int = 1, calibration_merge: str = DEFAULT_MERGE, replace: bool = False,
             emulation_repeats: int = 1) -> dict:
    if real_repeats < 1:
        raise PrismError(f"--real-repeats must be at least 1, got {real_repeats}")
    if emulation_repeats < 1:
        raise PrismError(f"--emulation-repeats must be at least 1, got {emulation_repeats}")
    job = load_job(job_path)
    ranks = parse_rank_ranges(ranks_text, job.world_size)
    run = Path(out or f"validate-{job.name}")
    skip = job.iterations.warmup
    record_probe = probe_ms()
    real = record_job(job, run, timeout_s=timeout_s, replace=replace)
    repeats = []

    def record_repeat() -> None:
        repeats.append(record_job(job, run / REPEATS_DIR / str(len(repeats) + 1), timeout_s=timeout_s,
                                  replace=replace))

    # The further real runs go between the calibration's rounds and after each emulation (one kept
    # for after the first), so that the real runs the times are compared with sample the same
    # stretch of a drifting host as the calibration and the emulations do (docs/emulate.md, session 46).
    between = min(max(0, real_repeats - 2), max(0, calibration_repeats - 1))
    cal = calibrate_run(run, slice_size=slice_size, skip_steps=skip, timeout_s=timeout_s, device=device,
                        repeats=calibration_repeats, merge=calibration_merge,
                        between_rounds=lambda k: record_repeat() if k < between else None)
    ensure_recorded(run, ranks, timeout_s=timeout_s)
    emus = []
    for _ in range(emulation_repeats):
        emus.append(emulate_and_report(run, EmulateOptions(ranks=ranks, timeout_s=timeout_s, **(device or {})),
                                       skip_steps=skip))
        if len(repeats) < real_repeats - 1:
            record_repeat()
    while len(repeats) < real_repeats - 1:
        record_repeat()
    emu = emus[0]
    rows = {}
    for r in ranks:
        row = emu.data["ranks"][str(r)]
        steps_ms = median_steps([e.data["ranks"][str(r)].get("step_ms", []) for e in emus])
        fid = rank_fidelity(r, real, emu.nodes[r], emu.groups, losses=row.get("losses", []),
                            steps_ms=steps_ms, peak_memory_bytes=row.get("peak_memory_bytes", -1),
                            measured_peak_memory_bytes=row.get("measured_peak_memory_bytes", -1), skip=skip,
                            real_repeats=repeats)
        spread = run_spread([[t / 1e6 for t in g.summaries[r].step_times_ns] for g in (real, *repeats)], skip)
        collected = captured_losses(run, r)
        bitwise = collected is not None and losses_bitwise_equal(row.get("losses", []), collected)
        rows[r] = {"prism": {**dataclasses.asdict(fid), "memory_source": real.summaries[r].memory_source,
                             "losses_bitwise_collected": bitwise, "oom": row["oom"],
                             "has_loss": any(not math.isnan(x) for x in real.summaries[r].losses),
                             "diverged_ops": len(row.get("diverged_ops", [])),
                             "real_time_spread": dataclasses.asdict(spread) if spread else None,
                             "calibrated_ms": cal.report.ranks[r].calibrated_step_ns / 1e6
                             if cal.report.ranks[r].calibrated_steps_ns else None},
                   "torch_fake": _torch_fake(job, r, real, skip, timeout_s, run) if torch_fake else None}
    return nonfinite_as_null({"job": job.name, "world_size": job.world_size, "sandbox_ranks": list(ranks),
                              "run_dir": str(run), "skip_steps": skip, "real_repeats": real_repeats,
                              "calibration_repeats": calibration_repeats, "calibration_merge": calibration_merge,
                              "emulation_repeats": emulation_repeats,
                              "host_probe_ms": {"record": record_probe, "calibrate": list(cal.host_probe_ms),
                                                "emulate": emu.data["host_probe_ms"]},
                              "emulation": str(emu.out_dir), "emulations": [str(e.out_dir) for e in emus],
                              "ranks": rows, "outside_writes": outside_writes(run),
                              "ranks_without_steps": [r for r in ranks_without_steps(real) if r in ranks]})


def _known(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _pct(x, sign: str = "") -> str:
    return f"{x * 100:{sign}.2f} %" if _known(x) else "—"


def _ms(x) -> str:
    return f"{x:.2f}" if _known(x) else "—"


def _b(b) -> str:
    return "—" if b is None or b < 0 else f"{b:,} B"


def _real_cell(c: dict) -> str:
    if c["real_min_bytes"] == c["real_max_bytes"]:
        return _b(c["real_min_bytes"])
    return f"{_b(c['real_min_bytes'])} – {_b(c['real_max_bytes'])} (timing-dependent)"


def _unmeasured(c: dict) -> bool:
    """Neither side has this peak (e.g. the measured steps' window of a job whose steps were found
    only afterwards): nothing to compare, and no verdict."""
    return c["emulated_bytes"] < 0 and (not c["real_bytes"] or max(c["real_bytes"]) < 0)


def _why_no_measured_peak(memory_source: str) -> str:
    if memory_source == "cpu.peak_rss":
        return ("the measured steps' peak was measured on neither side: the job ran with PRISM_MEMORY=rss, whose "
                "peak (the process's RSS) cannot be reset at the measured steps; compare the whole-run peak, or "
                "leave PRISM_MEMORY unset for the tracked peaks (docs/emulate.md)")
    return ("the measured steps' peak was measured on neither side: no step ended while the job ran (its steps "
            "were found afterwards, from its comm sequence); compare the whole-run peak, or set "
            "iterations.boundary in the job file (docs/emulate.md)")


def _emulated_cell(c: dict) -> str:
    if _unmeasured(c):
        return "— (not measured)"
    verdict = "equal" if c["equal"] else "in real spread" if c["in_real_spread"] else "OUT of real spread"
    return f"{_b(c['emulated_bytes'])} ({verdict})"


def print_validation(result: dict, console: Console, *, timing: bool = True) -> None:
    """``timing=False``: the iteration-time rows say the real run is not a valid timing reference
    on this host (e.g. a W=8 real-model job on 2 cores) instead of printing an error figure."""
    repeats = result.get("real_repeats", 1)
    runs = f"{repeats} real runs" if repeats > 1 else "the real run"
    emulations = result.get("emulation_repeats", 1)
    emulated = f" ({emulations} emulations)" if emulations > 1 else ""
    table = Table(title=f"validate {result['job']} W={result['world_size']}: sandbox {result['sandbox_ranks']}{emulated} "
                        f"vs {runs} (first {result['skip_steps']} step(s) skipped)", title_justify="left")
    table.add_column("metric")
    for r in result["ranks"]:
        table.add_column(f"prism emulate r{r}", justify="right")
        table.add_column(f"torch fake PG r{r}", justify="right")
    peak_rows = [f"{_PEAK_ROWS[k]} ({w})" for k in PEAK_KINDS for w in ("real", "emulated")]
    metrics = ["comm signature match", "losses bitwise = collected", "losses equal real", "iteration time error (mean)",
               "iteration time error (max step)", "iteration ms (real)", "real runs among themselves", *peak_rows]
    cells = {m: [] for m in metrics}
    notes = []
    for r, v in result["ranks"].items():
        p, f = v["prism"], v["torch_fake"]
        t = p["time"]
        cells["comm signature match"].append(_pct(p["signature_match"]))
        if not p.get("has_loss", True):  # nothing to compare: no step of the real run had a backward
            cells["losses bitwise = collected"].append("— (no loss)")
            cells["losses equal real"].append("— (no loss)")
        else:
            cells["losses bitwise = collected"].append("yes" if p.get("losses_bitwise_collected") else "no")
            cells["losses equal real"].append("yes" if p["losses_equal"] else f"no (max rel {p['max_loss_rel_diff']:.1e})")
        cells["iteration time error (mean)"].append(_pct(t["mean_rel_error"], "+"))
        cells["iteration time error (max step)"].append(_pct(t["max_rel_error"]))
        cells["iteration ms (real)"].append(f"{_ms(t['real_mean_ms'])} (emu {_ms(t['mean_ms'])})")
        sp = p.get("real_time_spread")
        cells["real runs among themselves"].append(
            f"±{_pct(sp['mean_abs_rel_error'])} (max step {_pct(sp['max_step_rel_error'])})" if sp
            else "— (--real-repeats 3 or more)")
        for k in PEAK_KINDS:
            c = p["peaks"][k]
            cells[f"{_PEAK_ROWS[k]} (real)"].append(_real_cell(c))
            cells[f"{_PEAK_ROWS[k]} (emulated)"].append(_emulated_cell(c))
            if _unmeasured(c) and k == "measured" and not any("measured on neither side" in n for n in notes):
                notes.append(_why_no_measured_peak(p.get("memory_source", "")))
            if c["timing_dependent"]:
                notes.append(f"rank {r}: its {_PEAK_NOTES[k]} is timing-dependent: {len(c['real_bytes'])} real runs gave "
                             f"{', '.join(_b(b) for b in c['real_bytes'])} (which comm buffers are still in flight "
                             "depends on when peers arrive; docs/emulate.md)")
        if f is None:
            for m in metrics:
                cells[m].append("—")
        elif f["status"] == "crashed":
            call = f.get("call", "")
            cells["comm signature match"].append(f"crashed{f' in {call}' if call else ''}")
            where = f" in dist.{call}" + (f" (called at {f['site']})" if f.get("site") else "") if call else ""
            notes.append(f"torch fake PG r{r} crashed{where}: {f['error'][:300]} (the fake process group moves no "
                         "data: what a rank receives, a size or a pickled object included, is whatever the buffer held)")
            for m in metrics[1:]:
                cells[m].append("—")
        else:
            ft = f["time"]
            cells["comm signature match"].append(_pct(f["signature_match"]))
            cells["losses bitwise = collected"].append("—")
            cells["losses equal real"].append("—" if not p.get("has_loss", True)
                                              else "yes" if f["losses_equal"] else "no (garbage values)")
            cells["iteration time error (mean)"].append(f"{_pct(ft['mean_rel_error'], '+')} (no peer waits)")
            cells["iteration time error (max step)"].append(_pct(ft["max_rel_error"]))
            cells["iteration ms (real)"].append(f"(fake {_ms(ft['mean_ms'])})")
            cells["real runs among themselves"].append("")
            fake = {"measured": f.get("measured_peak_memory_bytes", -1), "run": f["peak_memory_bytes"]}
            for k in PEAK_KINDS:
                cells[f"{_PEAK_ROWS[k]} (real)"].append("")
                cells[f"{_PEAK_ROWS[k]} (emulated)"].append(_b(fake[k]))
    if not timing:
        for m in ("iteration time error (mean)", "iteration time error (max step)", "iteration ms (real)",
                  "real runs among themselves"):
            cells[m] = ["not comparable on this host" if i % 2 == 0 else "—" for i in range(len(cells[m]))]
    for m in metrics:
        table.add_row(m, *cells[m])
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)
    console.print(f"run: {result['run_dir']}  emulation: {result['emulation']}")
    for write in result.get("outside_writes", []):
        console.print(f"warning: the script wrote outside its working directory: {write}", highlight=False)
    print_no_steps(result.get("ranks_without_steps", []), console)
    if probes := result.get("host_probe_ms"):
        print_host_speed([("at the real run", [probes["record"]]), ("during the calibration", probes["calibrate"]),
                          ("at the emulation", [probes["emulate"]])], console)


def run(args: argparse.Namespace) -> int:
    result = validate(args.job, args.ranks, args.out, slice_size=args.slice_size, timeout_s=args.timeout,
                      torch_fake=not args.no_torch_fake, device=device_options(args), real_repeats=args.real_repeats,
                      calibration_repeats=args.calibration_repeats, calibration_merge=args.calibration_merge,
                      replace=args.force, emulation_repeats=args.emulation_repeats)
    print_validation(result, Console())
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    return 0
