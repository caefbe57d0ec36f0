#!/usr/bin/env python3
"""GPU context switching check: W=8 logical ranks on one GPU with K=2 slots, as JSON.

Every rank holds ``--gib-per-rank`` GiB of device state, so 8 resident ranks need 8x that, more
than ``--budget-gib``; the collection must stay under the budget because a rank that releases its
slot is checkpointed off the GPU (cuCheckpointProcessLock/Checkpoint) and restored before it runs
again (Restore/Unlock). Each rank verifies its device state after every step (data intact).
GPU memory in use is sampled with nvidia-smi during the run.

    python bench/gpu_collect_swap.py --gib-per-rank 2 --budget-gib 10 --steps 2
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prism.coordinator import CollectOptions, collect_job  # noqa: E402
from prism.core.config import job_from_dict  # noqa: E402

TRAIN = '''
import argparse, os
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--gib", type=float, required=True)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
state = torch.full((int(args.gib * 2**30) // 4,), float(rank + 1), device=device)
torch.manual_seed(0)
model = torch.nn.Linear(512, 512).to(device)
for prm in model.parameters():
    dist.broadcast(prm.data, src=0)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    x = torch.randn(64, 512, device=device, generator=torch.Generator(device).manual_seed(rank * 100 + step))
    loss = model(x).square().mean()
    loss.backward()
    for prm in model.parameters():
        dist.all_reduce(prm.grad)
        prm.grad /= world
    opt.step()
    opt.zero_grad()
    # min and max, not a float64 sum: that would allocate a 2x temporary and double the footprint
    lo, hi = state.min().item(), state.max().item()
    if lo != hi or lo != float(rank + 1):
        raise RuntimeError(f"rank {rank}: device state changed across context switches: min {lo}, max {hi}, "
                           f"expected {rank + 1}")
dist.destroy_process_group()
'''


def gpu_used_mib(index: int = 0) -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(index)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[0])


def _rank_of(pid: int) -> str:
    """The logical rank a worker process runs (from its spec path), or its pid."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid{pid}"
    for arg in argv:
        name = Path(arg.decode(errors="replace")).name
        if name.startswith("spec-") and name.endswith(".json"):
            return f"rank{int(name[5:-5])}"
    return f"pid{pid}"


def per_process_mib() -> dict[str, int]:
    """Device memory per process that has a CUDA context (nvidia-smi's compute apps)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    used = {}
    for line in out.strip().splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[_rank_of(int(pid))] = int(mib)
    return used


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--gib-per-rank", type=float, default=2.0)
    ap.add_argument("--budget-gib", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=540.0)
    ap.add_argument("--samples", default="", help="write every memory sample (time, total MiB, MiB per rank) here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="prism-gpu-swap-"))
    (work / "train.py").write_text(TRAIN)
    job = job_from_dict({"name": "gpu-swap", "entrypoint": "train.py", "world_size": args.world, "device": "cuda",
                         "slots": args.slots, "args": ["--gib", str(args.gib_per_rank), "--steps", str(args.steps)],
                         "values": {"record": "none"}}, base_dir=work)
    baseline = gpu_used_mib()
    peak = [baseline]
    at_peak: dict[str, int] = {}
    samples: list[tuple[float, int, dict[str, int]]] = []
    stop = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        # Which processes hold device memory when the total peaks: a checkpointed rank must hold none.
        while not stop.is_set():
            used, apps = gpu_used_mib(), per_process_mib()
            samples.append((round(time.monotonic() - started, 2), used, apps))
            if used > peak[0]:
                peak[0] = used
                at_peak.clear()
                at_peak.update(apps)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out: dict = {"world_size": args.world, "slots": args.slots, "gib_per_rank": args.gib_per_rank,
                 "budget_gib": args.budget_gib, "resident_need_gib": args.world * args.gib_per_rank}
    try:
        result = collect_job(job, work / "run", CollectOptions(slots=args.slots, timeout_s=args.timeout))
        out.update(ok=True, wall_s=round(result.wall_s, 2), num_context_switches=result.num_context_switches,
                   max_active=result.max_active, swaps=result.swaps,
                   losses={r: list(s.losses) for r, s in result.graph.summaries.items()})
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        out.update(ok=False, error=str(e)[-3000:])
    finally:
        stop.set()
        sampler.join()
    out["gpu_baseline_gib"] = round(baseline / 1024, 2)
    out["gpu_peak_gib"] = round(peak[0] / 1024, 2)
    out["gpu_peak_above_baseline_gib"] = round((peak[0] - baseline) / 1024, 2)
    out["within_budget"] = (peak[0] - baseline) / 1024 <= args.budget_gib
    out["per_process_mib_at_peak"] = at_peak
    out["max_processes_holding_memory"] = max((sum(1 for m in apps.values() if m > 0) for _t, _u, apps in samples),
                                              default=0)
    if args.samples:
        Path(args.samples).write_text(json.dumps(samples))
    print(json.dumps(out, indent=2))
    return 0 if out.get("ok") and out["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
