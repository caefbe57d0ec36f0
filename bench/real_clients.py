"""Real training scripts that nobody here wrote: ``prism validate --ranks 0`` on pytorch/examples,
given by path (the code stays outside this repository), W=2, one rank per GPU.

    python bench/real_clients.py --examples-dir DIR [--cases fsdp2,fsdp2_mp_prefetch,fsdp2_dcp,ddp_torchrun]
                                 [--device cuda] [--json bench/results/real_clients.json]

DIR is a checkout of github.com/pytorch/examples (or a folder with its ``distributed/FSDP2/{example,
model,checkpoint,utils}.py`` and ``distributed/ddp-tutorial-series/{multigpu_torchrun,datautils}.py``).
Each case: a plain run of the unmodified script (no prism in the processes; in a copy of its folder,
since the scripts checkpoint beside themselves), then ``prism validate --ranks 0`` (record, capture,
calibration slices, emulation of rank 0 with rank 1 virtual). Per case: comm signature match, losses
bitwise equal to the collected (capture) run and equal to the real (``prism record``) run, whether the
example's folder is unchanged afterwards, writes outside the working directories, and real vs emulated
step ms (medians after the warmup) and peak bytes; for ``--collect-cases`` also ``prism collect`` (K=2,
``values.ranks: 0``: wall time, context switches, swaps). ``--device cpu`` runs the harness on CPU with
scripts patched to run there (a smoke run; the examples themselves need two GPUs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
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

WARMUP = 2
log = logging.getLogger("real_clients")
FSDP2 = "distributed/FSDP2/example.py"
DDP = "distributed/ddp-tutorial-series/multigpu_torchrun.py"
CASES = {
    "fsdp2": (FSDP2, []),
    "fsdp2_mp_prefetch": (FSDP2, ["--mixed-precision", "--explicit-prefetching"]),
    "fsdp2_dcp": (FSDP2, ["--dcp-api"]),
    "ddp_torchrun": (DDP, ["10", "5"]),
}


def folder_state(folder: Path) -> dict[str, str]:
    """Every entry of ``folder``: files by size, mtime and sha256; folders by name."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[rel] = f"{st.st_size}:{st.st_mtime_ns}:{hashlib.sha256(p.read_bytes()).hexdigest()[:16]}"
        else:
            out[rel] = "dir" if p.is_dir() else "link"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_run(script: Path, args: list[str], work: Path, device: str, world: int = 2) -> dict:
    """Every rank of the unmodified script, torchrun's environment, in a copy of its folder."""
    copy = work / "plain"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(script.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    procs = []
    for r in range(world):
        cmd = ([sys.executable, str(ROOT / "bench" / "_plain_rank.py"), str(work / f"plain-{r}.json"), str(WARMUP)]
               if device == "cuda" else [sys.executable])
        procs.append(subprocess.Popen([*cmd, str(copy / script.name), *args], cwd=copy,
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                      stdout=subprocess.DEVNULL, stderr=open(work / f"plain-{r}.log", "w")))
    t0 = time.time()
    log.info("%s: plain run of %s %s (W=%d)", work.name, script.name, " ".join(args), world)
    try:
        codes = [p.wait(timeout=900) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise RuntimeError(f"the plain run of {script.name} did not end in 900 s (see {work}/plain-*.log)") from None
    log.info("%s: plain run ended in %.1f s, exit codes %s", work.name, time.time() - t0, codes)
    if any(codes):
        raise RuntimeError(f"the plain run of {script.name} failed: exit codes {codes} (see {work}/plain-*.log)")
    row = {"plain_wall_s": round(time.time() - t0, 1)}
    if device == "cuda":
        d = json.loads((work / "plain-0.json").read_text())
        steady = d["step_ms"][WARMUP - 1:]
        row.update(real_ms=statistics.median(steady) if steady else None, real_peak_bytes=d["peak_whole_run_bytes"],
                   plain_steps=len(d["step_ms"]) + 1)
    return row


def collect_row(job_path: Path, run: Path) -> dict:
    """``prism collect`` of the job on K=2 slots with ``values.ranks: 0`` (issue 17: it stalled)."""
    import dataclasses

    from prism.coordinator import CollectOptions, collect_job
    from prism.core.config import ValuesPolicy, load_job

    job = load_job(job_path)
    job = dataclasses.replace(job, values=ValuesPolicy(ranks="0"))
    t0 = time.time()
    log.info("%s: prism collect (K=2, values.ranks 0)", job.name)
    result = collect_job(job, run, CollectOptions(slots=2, timeout_s=900, stall_report_s=30))
    d = result.as_dict()
    return {"collect_wall_s": round(time.time() - t0, 1), "collect_context_switches": d["num_context_switches"],
            "collect_collectives": d["num_collectives"], "collect_swaps": d["swaps"]}


def run_case(name: str, examples: Path, work: Path, device: str, collect: bool = False,
             device_path: str = "auto", slice_size: int = 1) -> dict:
    from prism.cli.validate import validate

    rel, args = CASES[name]
    script = (examples / rel).resolve()
    case = work / name
    case.mkdir(parents=True, exist_ok=True)
    job = {"name": name, "entrypoint": str(script), "args": args, "world_size": 2, "ranks_per_node": 2,
           "device": device, "slots": 2, "iterations": {"warmup": WARMUP, "measured": 3}}
    (case / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    row: dict = {"name": name, "script": rel, "args": args}
    before = folder_state(script.parent)
    row.update(plain_run(script, args, case, device))
    t0 = time.time()
    log.info("%s: prism validate --ranks 0", name)
    device_opts = ({"device_path": device_path, "sandbox_gpus": (), "assistant_gpus": ()}
                   if device == "cuda" or device_path != "auto" else None)
    result = validate(str(case / "job.yaml"), "0", str(case / "run"), slice_size=slice_size, timeout_s=600,
                      torch_fake=False, device=device_opts)
    row["validate_wall_s"] = round(time.time() - t0, 1)
    log.info("%s: validate ended in %.1f s", name, row["validate_wall_s"])
    if collect:
        try:
            row.update(collect_row(case / "job.yaml", case / "collect-run"))
        except Exception as e:  # noqa: BLE001 - reported beside the validation
            row["collect_error"] = f"{type(e).__name__}: {e}"[-4000:]
        shutil.rmtree(case / "collect-run", ignore_errors=True)
    after = folder_state(script.parent)
    prism = result["ranks"][0]["prism"]
    report = json.loads((Path(result["emulation"]) / "report.json").read_text())["ranks"]["0"]
    emu = report.get("step_ms", [])[WARMUP:]
    row.update(
        signature_match=prism["signature_match"],
        losses_bitwise_collected=prism["losses_bitwise_collected"],
        losses_equal_real=prism["losses_equal"],
        diverged_ops=prism["diverged_ops"],
        folder_unchanged=before == after,
        folder_changes=sorted(set(before.items()) ^ set(after.items()))[:20],
        outside_writes=result["outside_writes"],
        outputs=sorted(str(p.relative_to(case / "run" / "outputs")) for p in (case / "run" / "outputs").rglob("*")
                       if p.is_file() and p.suffix != ".json")[:40],
        record_ms=prism["time"]["real_mean_ms"],
        emulated_ms=statistics.median(emu) if emu else None,
        calibrated_ms=prism["calibrated_ms"],
        record_peak_bytes=prism["real_peak_memory_bytes"],
        emulated_peak_bytes=prism["peak_memory_bytes"],
        layout=report.get("layout", ""),
    )
    ref = row.get("real_ms")
    if ref and emu:
        row["emulated_rel_error"] = statistics.mean(emu) / ref - 1
    if ref and row.get("real_peak_bytes") and row["emulated_peak_bytes"] and row["emulated_peak_bytes"] > 0:
        row["peak_rel_error"] = row["emulated_peak_bytes"] / row["real_peak_bytes"] - 1
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples-dir", required=True, help="a pytorch/examples checkout (outside this repository)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "real_clients.json"))
    p.add_argument("--work", default=None, help="where the runs go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep each case's run directory")
    p.add_argument("--collect-cases", default="fsdp2",
                   help="cases that also run prism collect (K=2, values.ranks: 0); '' for none")
    p.add_argument("--device-path", default="auto", choices=("auto", "nccl", "host", "lanes"),
                   help="the emulation's data path (lanes: the nccl path's protocol over gloo, on CPU)")
    p.add_argument("--slice-size", type=int, default=1, help="calibration slice size (2: both ranks real)")
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import torch

    examples = Path(ns.examples_dir).resolve()
    work = Path(ns.work or tempfile.mkdtemp(prefix="prism-real-clients-"))
    out = {"device": torch.cuda.get_device_name(0) if ns.device == "cuda" else "cpu",
           "num_gpus": torch.cuda.device_count(), "torch": torch.__version__, "host": platform.node(),
           "examples_dir": str(examples), "warmup_steps": WARMUP, "cases": []}
    # Cases run by an earlier call (one device command may not fit all four) are kept.
    earlier = json.loads(Path(ns.json).read_text()).get("cases", []) if Path(ns.json).is_file() else []
    names = ns.cases.split(",")
    out["cases"] = [c for c in earlier if c.get("name") not in names]
    for name in names:
        try:
            row = run_case(name, examples, work, ns.device, collect=name in ns.collect_cases.split(","),
                           device_path=ns.device_path, slice_size=ns.slice_size)
        except Exception as e:  # noqa: BLE001 - a failed case is a result too
            row = {"name": name, "error": f"{type(e).__name__}: {e}"[-4000:]}
        if not ns.keep:
            shutil.rmtree(work / name / "run", ignore_errors=True)
        print(json.dumps(row), flush=True)
        out["cases"].append(row)
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
