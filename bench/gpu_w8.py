"""Ground truth at W=8 on 8 GPUs (issue #16): for each case, the plain W=8 NCCL job (one rank per
GPU), then ``prism validate`` of two sandbox ranks — record, collect on K=2 slots, calibrate,
emulate with the sandbox ranks on GPUs 0, 1 and two replayers on assistant GPUs 2, 3 — and the
same emulation again on fewer GPUs (one sandbox rank on GPU 0, one replayer on GPU 1). Writes
bench/results/gpu_w8.json in the shape of gpu_fidelity.json (one row per case and layout; the
row's figures are its first sandbox rank's, ``ranks`` has each sandbox rank's).

    python bench/gpu_w8.py [--cases hybrid,ddp,pp_slow_stage,moe] [--layouts 4gpu,2gpu]
    python bench/gpu_w8.py --device cpu --cases ddp --layouts 4gpu   # a dry run of the script on CPU

Needs 8 GPUs for the real runs (``nvidia-h200-x8``); ``--device cpu`` runs the examples' small
sizes on gloo to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_fidelity import STEPS, WARMUP, _save_graphs, run_case  # noqa: E402

WORLD = 8
# name: (example, GPU-size args, sandbox ranks); sizes aim at >= 200 ms steps on H200.
CASES = {
    "hybrid": ("hybrid", ["--pp", "2", "--tp", "2", "--dp", "2", "--microbatches", "8", "--microbatch-size", "512",
                          "--dim", "4096", "--layers-per-stage", "4"], "2,5"),
    "ddp": ("ddp", ["--batch", "4096", "--dim", "4096", "--hidden", "4096", "--layers", "8", "--bucket-cap-mb", "25"],
            "0,1"),
    "pp_slow_stage": ("pp", ["--pp", "4", "--schedule", "1f1b", "--microbatches", "8", "--microbatch-size", "1024",
                             "--dim", "4096", "--layers-per-stage", "4", "--slow-stage", "2", "--slow-repeat", "2"],
                      "2,5"),
    "moe": ("moe", ["--ep", "8", "--tokens", "16384", "--dim", "2048", "--hidden", "8192", "--experts-per-rank", "2"],
            "0,1"),
}
# The same jobs at the examples' small defaults (the CPU dry run).
SMALL = {"hybrid": ["--pp", "2", "--tp", "2", "--dp", "2"], "ddp": [], "pp_slow_stage": ["--pp", "4", "--slow-stage", "2"],
         "moe": ["--ep", "8"]}
LAYOUTS = {
    # two sandbox ranks on sandbox GPUs 0, 1; two replayers on assistant GPUs 2, 3
    "4gpu": {"sandbox_gpus": (0, 1), "assistant_gpus": (2, 3), "num_replayers": 2},
    # how few GPUs the figures need: the first sandbox rank alone on GPU 0, one replayer on GPU 1
    "2gpu": {"sandbox_gpus": (0,), "assistant_gpus": (1,), "num_replayers": 1},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu_w8.json"))
    p.add_argument("--work", default=None)
    p.add_argument("--save-graphs", default=None, metavar="DIR")
    ns = p.parse_args()
    import torch

    if ns.device == "cuda" and torch.cuda.device_count() < WORLD:
        raise SystemExit(f"gpu_w8: the real W={WORLD} runs need {WORLD} GPUs; this host has "
                         f"{torch.cuda.device_count()} (use --device cpu for a dry run of the script)")
    work = Path(ns.work or tempfile.mkdtemp(prefix="prism-gpu-w8-"))
    out = {"device": torch.cuda.get_device_name(0) if ns.device == "cuda" else "cpu (dry run)",
           "num_gpus": torch.cuda.device_count(), "torch": torch.__version__, "host": platform.node(),
           "world_size": WORLD, "warmup_steps": WARMUP, "steps": STEPS, "cases": []}
    for name in ns.cases.split(","):
        example, args, ranks = CASES[name]
        if ns.device == "cpu":
            args = SMALL[name]
        for layout_name in ns.layouts.split(","):
            layout = dict(LAYOUTS[layout_name]) if ns.device == "cuda" else {"num_replayers": LAYOUTS[layout_name]["num_replayers"]}
            sandbox = ranks if layout_name != "2gpu" else ranks.split(",")[0]
            tag = f"{name}-{layout_name}"
            try:
                row = run_case(tag, example, args, work, world=WORLD, ranks=sandbox, slots=2, slice_size=2,
                               device=ns.device, layout=layout, timeout_s=600)
            except Exception as e:  # noqa: BLE001 - a failed case is a result too
                row = {"name": tag, "error": f"{type(e).__name__}: {e}"[-4000:]}
            row["layout_name"] = layout_name
            print(json.dumps(row), flush=True)
            out["cases"].append(row)
            Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.json).write_text(json.dumps(out, indent=1))
            if ns.save_graphs:
                _save_graphs(work / tag / "run", Path(ns.save_graphs) / tag)
            shutil.rmtree(work / tag / "run", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
