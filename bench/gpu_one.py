"""One GPU for a sandbox rank and its replayer (issue #10: the ``ipc`` data path).

A W=2 NCCL job cannot run for real on one GPU (NCCL refuses two ranks on one device), which is
the situation prism is for. Per case, on one GPU: ``prism collect`` (both ranks on the GPU, the
coordinator's CPU collectives), ``prism calibrate --slice-size 1 --device-path ipc`` and
``prism emulate --ranks 0`` with vrank 1 in a replayer on the same GPU: lanes over CUDA IPC
(prism.nccl_patches.ipc_lane). For comparison on the same machine, the emulation again with
``--device-path host`` (gloo with host staging: what one GPU took before). The ground truth is
the 2-GPU real run of the same case from ``bench/results/gpu_fidelity.json`` (same GPU model,
``prism record`` of the NCCL job at W=2), named ``reference_*`` with the session it came from.

    python bench/gpu_one.py [--cases ddp_bucket25] [--quick] [--json PATH] [--paths ipc,host] [--mps]

``--mps``: calibrate and emulate with ``--mps`` (prism.core.mps: a private CUDA MPS server, so the
sandbox rank's and the replayer's kernels are not time-sliced). ``--device cpu``: a dry run of the
bench itself on CPU (``--paths lanes,host``).

ms: medians over the steps after the warmup; peaks: ``max_memory_allocated`` over the whole run.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_fidelity import CASES, QUICK, STEPS, WARMUP, write_job  # noqa: E402

log = logging.getLogger("gpu_one")


def run_case(name: str, example: str, args: list[str], work: Path, *, paths: list[str],
             device: str = "cuda", timeout_s: float = 500, on_update=lambda row: None,
             mps: bool = False) -> dict:
    from prism.coordinator import CollectOptions, collect_job
    from prism.core.config import load_job

    case_dir = work / name
    write_job(case_dir, name, example, args, world=2, slots=2, device=device)
    job = load_job(str(case_dir / "job.yaml"))
    run = case_dir / "run"
    row: dict = {"name": name, "example": example, "args": args, "world_size": 2, "sandbox_ranks": [0]}
    t0 = time.time()
    collect_job(job, run, CollectOptions(slots=2, timeout_s=timeout_s))
    row["collect_wall_s"] = round(time.time() - t0, 1)
    row["mps"] = mps
    _paths(row, run, paths, device, timeout_s, on_update, name, mps=mps)
    return row


def _paths(row: dict, run: Path, paths: list[str], device: str, timeout_s: float, on_update, name: str, *,
           mps: bool) -> None:
    from prism.vrank_replayer import EmulateOptions, captured_losses
    from prism.vrank_replayer.calibrate_run import calibrate_run
    from prism.vrank_replayer.emulate_report import emulate_and_report
    from prism.vrank_replayer.fidelity import losses_bitwise_equal

    for path in paths:
        gpus = (0,) if device == "cuda" else ()
        layout = {"device_path": path, "sandbox_gpus": gpus, "assistant_gpus": gpus, "mps": mps}
        t0 = time.time()
        # The timed graph is per data path: the slices run on the path the emulation takes.
        shutil.rmtree(run / "graph" / "timed", ignore_errors=True)
        cal = calibrate_run(run, slice_size=1, skip_steps=WARMUP, timeout_s=timeout_s, device=layout)
        cal_wall = time.time() - t0
        t0 = time.time()
        emu = emulate_and_report(run, EmulateOptions(ranks=(0,), timeout_s=timeout_s, **layout), skip_steps=WARMUP)
        report = json.loads((Path(emu.out_dir) / "report.json").read_text())
        r0 = report["ranks"]["0"]
        steps = r0.get("step_ms", [])[WARMUP:]
        collected = captured_losses(run, 0)
        cal_rank = cal.report.ranks[0]
        live = json.loads((Path(emu.out_dir) / "rank-00000.live.json").read_text())
        row[path] = {
            "device_path": live.get("device_path"),
            "lane_kinds": live.get("lane_kinds"),
            "emulated_ms": statistics.median(steps) if steps else None,
            "emulated_step_ms": steps,
            "calibrated_ms": cal_rank.calibrated_step_ns / 1e6 if cal_rank.calibrated_steps_ns else None,
            "emulated_peak_bytes": r0.get("peak_memory_bytes"),
            "losses_equal": collected is not None and losses_bitwise_equal(r0.get("losses", []), collected),
            "diverged_ops": len(r0.get("diverged_ops", [])),
            "calibrate_wall_s": round(cal_wall, 1),
            "emulate_wall_s": round(time.time() - t0, 1),
        }
        log.info("%s %s: %s", name, path, {k: v for k, v in row[path].items() if k != "emulated_step_ms"})
        on_update(row)  # a path's figures are kept even if a later one runs out of time


def _reference(name: str) -> dict:
    """The 2-GPU figures of the case (bench/results/gpu_fidelity.json), if it was run there."""
    path = ROOT / "bench" / "results" / "gpu_fidelity.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    for c in data.get("cases", []):
        if c.get("name") == name and "error" not in c:
            return {"reference": "bench/results/gpu_fidelity.json (2 GPUs, W=2, one rank per GPU, NCCL)",
                    "reference_device": data.get("device"), "reference_real_ms": c.get("real_ms"),
                    "reference_record_ms": c.get("record_ms"),
                    "reference_emulated_ms_2gpu": c.get("emulated_ms"),
                    "reference_peak_bytes": c.get("real_peak_bytes") or c.get("record_peak_bytes"),
                    "reference_emulated_peak_bytes_2gpu": c.get("emulated_peak_bytes")}
    return {}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="ddp_bucket25")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run of the path)")
    p.add_argument("--paths", default="ipc,host", help="data paths to emulate on, in order")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu_one_ipc.json"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of the bench itself (paths lanes,host)")
    p.add_argument("--mps", action="store_true",
                   help="calibrate and emulate with --mps (a private CUDA MPS server per slice and emulation: "
                        "no time slicing between the sandbox rank's and the replayer's kernels)")
    p.add_argument("--work", default=None)
    p.add_argument("--keep", action="store_true")
    ns = p.parse_args()
    import torch

    table = QUICK if ns.quick else CASES
    work = Path(ns.work or tempfile.mkdtemp(prefix="prism-gpu-one-"))
    out = {"benchmark": "gpu_one", "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
           "num_gpus": torch.cuda.device_count(), "torch": torch.__version__, "host": platform.node(),
           "quick": ns.quick, "warmup_steps": WARMUP, "steps": STEPS, "cases": []}

    def save(row: dict) -> None:
        out["cases"] = [c for c in out["cases"] if c.get("name") != row["name"]] + [row]
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=1))

    for name in ns.cases.split(","):
        example, args = table[name]
        ref = {} if ns.quick else _reference(name)
        try:
            row = run_case(name, example, args, work, paths=ns.paths.split(","), device=ns.device, mps=ns.mps,
                           on_update=lambda r, ref=ref: save({**r, **ref}))
            row.update(ref)
            if ref:
                for path in ns.paths.split(","):
                    ref, got = row.get("reference_record_ms"), row.get(path, {}).get("emulated_ms")
                    if ref and got:
                        row[path]["rel_error_vs_reference_record"] = got / ref - 1
        except Exception as e:  # noqa: BLE001 - a failed case is a result too
            log.exception("case %s failed", name)
            row = {"name": name, "error": f"{type(e).__name__}: {e}"[-4000:]}
        print(json.dumps(row), flush=True)
        save(row)
        if not ns.keep:
            shutil.rmtree(work / name / "run", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
