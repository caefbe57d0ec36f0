"""One rank of a plain (prism-free) run, timed from outside the script: a CUDA event at each
optimizer step (never a synchronize), read at the end; ``max_memory_allocated`` over the whole run
and after the warmup steps. Without CUDA (a CPU dry run of the benchmarks): the host clock, and no
peaks (-1). Usage: python bench/_plain_rank.py OUT.json WARMUP SCRIPT [ARGS...]
with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""

import json
import os
import runpy
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

out, warmup, script, *args = sys.argv[1:]
warmup = int(warmup)
events: list = []
whole_before_reset = [0]


CUDA = torch.cuda.is_available()


def _step_end(_opt, _args, _kwargs) -> None:
    if not CUDA:
        events.append(time.perf_counter())
        return
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    events.append(ev)
    if len(events) == warmup:
        whole_before_reset[0] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()


register_optimizer_step_post_hook(_step_end)
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python does for a script (sibling imports)
runpy.run_path(script, run_name="__main__")
if CUDA:
    torch.cuda.synchronize()
    steps_ms = [events[i - 1].elapsed_time(events[i]) for i in range(1, len(events))]
    steady = torch.cuda.max_memory_allocated()
else:
    steps_ms = [(events[i] - events[i - 1]) * 1e3 for i in range(1, len(events))]
    steady = -1
with open(out, "w") as f:
    json.dump({"step_ms": steps_ms, "peak_after_warmup_bytes": steady,
               "peak_whole_run_bytes": max(steady, whole_before_reset[0]) if CUDA else -1}, f)
