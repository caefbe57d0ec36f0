"""GPU fidelity at W=2 (two GPUs, one rank per GPU, NCCL): for each case, the plain torch run
(timed from outside the script), ``prism record`` and ``prism validate --ranks 0`` (record,
calibrate, emulate rank 0 on the sandbox GPU with vrank 1 on the assistant GPU, the nccl data
path), compared. Writes bench/results/gpu_fidelity.json.

    python bench/gpu_fidelity.py [--cases ddp_bucket25,pp2] [--quick] [--json PATH]

ms are medians over the steps after the warmup; ``*_peak_bytes`` are ``max_memory_allocated``
over the whole run (``plain_peak_after_warmup_bytes``: after a reset at the end of the warmup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARMUP, STEPS = 2, 6
CASES = {
    # the two DDP jobs of the GPU issue (the second at a batch that makes its steps >= 50 ms)
    "ddp_bucket25": ("ddp", ["--batch", "4096", "--dim", "4096", "--hidden", "4096", "--layers", "6", "--bucket-cap-mb", "25"]),
    "ddp_default_buckets": ("ddp", ["--batch", "16384", "--dim", "4096", "--hidden", "4096", "--layers", "4", "--bucket-cap-mb", "25"]),
    "fsdp2": ("fsdp2", ["--batch", "32", "--seq", "1024", "--dim", "1024", "--heads", "16", "--layers", "8", "--vocab", "8192"]),
    "tp2": ("tp", ["--tp", "2", "--batch", "8192", "--dim", "4096", "--hidden", "16384", "--layers", "4"]),
    "pp2_1f1b": ("pp", ["--pp", "2", "--schedule", "1f1b", "--microbatches", "8", "--microbatch-size", "2048", "--dim", "4096", "--layers-per-stage", "6"]),
}
QUICK = {name: (ex, [a if not a.isdigit() or int(a) < 64 else str(max(64, int(a) // 16)) for a in args])
         for name, (ex, args) in CASES.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_run(example: str, args: list[str], out: Path, world: int = 2) -> dict:
    """Every rank of the unmodified script, one per GPU, NCCL; no prism in the processes."""
    # OMP_NUM_THREADS=1 as torchrun and prism's workers set it: the plain run sees the same host.
    env = {"OMP_NUM_THREADS": "1", **os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    script = ROOT / "examples" / example / "train.py"
    procs = []
    for r in range(world):
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "_plain_rank.py"), str(out / f"plain-{r}.json"), str(WARMUP),
             str(script), *args], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=script.parent))
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"plain run of {example} failed: exit codes {codes}")
    by_rank = {}
    for r in range(world):
        d = json.loads((out / f"plain-{r}.json").read_text())
        by_rank[r] = {"real_ms": statistics.median(d["step_ms"][WARMUP - 1:]), "real_peak_bytes": d["peak_whole_run_bytes"],
                      "plain_peak_after_warmup_bytes": d["peak_after_warmup_bytes"]}
    return {**by_rank[0], "plain_by_rank": by_rank}


def write_job(case_dir: Path, name: str, example: str, args: list[str], *, world: int, slots: int,
              device: str) -> dict:
    """CASE_DIR/job.yaml for an example at the bench's steps and warmup; returns its contents."""
    case_dir.mkdir(parents=True, exist_ok=True)
    job = {"name": name, "entrypoint": str(ROOT / "examples" / example / "train.py"),
           "args": ["--device", device, *args, "--steps", str(STEPS)], "world_size": world,
           "ranks_per_node": min(world, 8), "device": device,
           "iterations": {"warmup": WARMUP, "measured": STEPS - WARMUP}, "slots": slots}
    (case_dir / "job.yaml").write_text(yaml.safe_dump(job))
    return job


def run_case(name: str, example: str, args: list[str], work: Path, *, world: int = 2, ranks: str = "0",
             slots: int = 2, slice_size: int = 1, device: str = "cuda", layout: dict | None = None,
             timeout_s: float = 500) -> dict:
    """Plain run, then ``prism validate`` of ``ranks``; the row's figures are the first sandbox
    rank's, ``ranks`` has every sandbox rank's."""
    from prism.cli.validate import validate
    from prism.graph.io import read_graph

    case_dir = work / name
    job = write_job(case_dir, name, example, args, world=world, slots=slots, device=device)
    job_path = case_dir / "job.yaml"
    row: dict = {"name": name, "example": example, "args": args, "world_size": world, "sandbox_ranks": ranks}
    t0 = time.time()
    plain = plain_run(example, job["args"], case_dir, world=world)
    by_rank = plain.pop("plain_by_rank")
    row.update(plain)
    row["plain_wall_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    result = validate(str(job_path), ranks, str(case_dir / "run"), slice_size=slice_size, timeout_s=timeout_s,
                      torch_fake=False,
                      device={"device_path": "auto", "sandbox_gpus": (), "assistant_gpus": (), **(layout or {})})
    row["validate_wall_s"] = round(time.time() - t0, 1)
    real = read_graph(case_dir / "run" / "graph" / "real").summaries
    report = json.loads((Path(result["emulation"]) / "report.json").read_text())
    row["layout"] = report.get("layout", "")
    per_rank = {}
    for r_text, res in result["ranks"].items():
        r = int(r_text)
        per_rank[r] = {**by_rank[r], **_rank_figures(res["prism"], real[r], report["ranks"][str(r)], by_rank[r]["real_ms"])}
    row["ranks"] = {str(r): v for r, v in per_rank.items()}
    row.update(per_rank[min(per_rank)])
    return row


def _rank_figures(prism: dict, real, report: dict, ref: float | None) -> dict:
    record_steps = [s / 1e6 for s in real.step_times_ns[WARMUP:]]
    emu_steps = report.get("step_ms", [])[WARMUP:]
    row = dict(
        record_ms=statistics.median(record_steps) if record_steps else None,
        emulated_ms=statistics.median(emu_steps) if emu_steps else None,
        calibrated_ms=prism["calibrated_ms"],
        record_peak_bytes=prism["real_peak_memory_bytes"],
        emulated_peak_bytes=prism["peak_memory_bytes"],
        losses_equal=prism["losses_bitwise_collected"],
        losses_equal_record=prism["losses_equal"],
        signature_match=prism["signature_match"],
        diverged_ops=prism["diverged_ops"],
    )
    if emu_steps and ref:
        row["mean_rel_error"] = statistics.mean(emu_steps) / ref - 1
        row["max_rel_error"] = max(abs(s / ref - 1) for s in emu_steps)
    if row["record_ms"] and ref:
        row["record_rel_error"] = row["record_ms"] / ref - 1
    if row["calibrated_ms"] and ref:
        row["calibrated_rel_error"] = row["calibrated_ms"] / ref - 1
    return row


def _save_graphs(run: Path, dest: Path) -> None:
    """The small part of a run directory: graphs and JSON reports, none of the payloads."""
    for path in run.rglob("*"):
        if path.is_file() and "payloads" not in path.parts and path.stat().st_size < 256 << 20:
            target = dest / path.relative_to(run)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run of the path)")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu_fidelity.json"))
    p.add_argument("--work", default=None, help="where the runs go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep each case's run directory (the capture is large)")
    p.add_argument("--save-graphs", default=None, metavar="DIR",
                   help="copy each case's graphs and reports (not its payloads) to DIR/<case>/ before cleaning up")
    ns = p.parse_args()
    import torch

    table = QUICK if ns.quick else CASES
    work = Path(ns.work or tempfile.mkdtemp(prefix="prism-gpu-fidelity-"))
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
           "num_gpus": torch.cuda.device_count(), "torch": torch.__version__, "host": platform.node(),
           "warmup_steps": WARMUP, "steps": STEPS, "cases": []}
    previous = Path(ns.json)
    if previous.exists():  # a run of some cases keeps the other cases' rows of an earlier run
        kept = [c for c in json.loads(previous.read_text()).get("cases", []) if c.get("name") not in ns.cases.split(",")]
        out["cases"] = kept
    for name in ns.cases.split(","):
        example, args = table[name]
        try:
            row = run_case(name, example, args, work)
        except Exception as e:  # noqa: BLE001 - a failed case is a result too
            row = {"name": name, "error": f"{type(e).__name__}: {e}"[-4000:]}
        # The row first: deleting a capture of tens of GB takes long enough to be cut by a timeout.
        print(json.dumps(row), flush=True)
        out["cases"] = [c for c in out["cases"] if c.get("name") != name] + [row]
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=1))
        if ns.save_graphs:
            _save_graphs(work / name / "run", Path(ns.save_graphs) / name)
        if not ns.keep:
            shutil.rmtree(work / name / "run", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
