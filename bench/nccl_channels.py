"""Does a DDP step's compute slow down with the SMs NCCL's all-reduce kernels hold? The plain
(prism-free) W=2 DDP job of bench/gpu_fidelity.py run with NCCL limited to 1, 2, 4, 8 channels
(``NCCL_MAX_NCHANNELS``; a channel is one thread block on one SM) and with NCCL's default; median
step after the warmup. If the step shrinks towards the emulated one as channels go down, the
emulation's faster compute is SM occupancy (docs/gpu.md, "What is open").

    python bench/nccl_channels.py [--case ddp_bucket25] [--json bench/results/nccl_channels.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_fidelity import CASES, STEPS, plain_run  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="ddp_bucket25", choices=sorted(CASES))
    p.add_argument("--channels", default="default,1,2,4,8,default")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "nccl_channels.json"))
    ns = p.parse_args()
    example, args = CASES[ns.case]
    rows = []
    for setting in ns.channels.split(","):
        saved = os.environ.get("NCCL_MAX_NCHANNELS")
        if setting != "default":
            os.environ["NCCL_MAX_NCHANNELS"] = setting
        else:
            os.environ.pop("NCCL_MAX_NCHANNELS", None)
        with tempfile.TemporaryDirectory() as d:
            row = plain_run(example, ["--device", "cuda", *args, "--steps", str(STEPS)], Path(d))
        if saved is None:
            os.environ.pop("NCCL_MAX_NCHANNELS", None)
        else:
            os.environ["NCCL_MAX_NCHANNELS"] = saved
        rows.append({"nccl_max_nchannels": setting, "real_ms": row["real_ms"]})
        print(json.dumps(rows[-1]), flush=True)
    Path(ns.json).write_text(json.dumps({"case": ns.case, "args": args, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
