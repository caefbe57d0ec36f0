"""One rank of a plain (no prism) run for bench/record_overhead.py: the script as torchrun would
start it, plus one optimizer step post hook that notes the time of every step's end.

    python bench/_plain_rank.py OUT.json script.py [args...]     # RANK, WORLD_SIZE, MASTER_* set
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def main() -> None:
    out, script, *args = sys.argv[1:]
    from torch.optim.optimizer import register_optimizer_step_post_hook

    ends: list[int] = []
    register_optimizer_step_post_hook(lambda *_a, **_k: ends.append(time.perf_counter_ns()))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        with open(out, "w") as f:
            json.dump({"step_ends_ns": ends}, f)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
