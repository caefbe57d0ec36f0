"""bench/record_overhead.py's step probe, loaded by every Python process that has this folder on
PYTHONPATH and PRISM_BENCH_STEP_DIR set: after each ``optimizer.step`` it appends the wall clock
(``perf_counter_ns``) and the process's CPU time (``process_time_ns``, all threads) to
``$PRISM_BENCH_STEP_DIR/pid-<pid>-<pass>.txt`` (``<pass>``: ``PRISM_RECORD_PASS`` — ``memory`` or
``timed`` under a two-pass ``prism record`` — else ``run``). The same probe in a plain run and under ``prism record``,
so both sides measure a step the same way.

With ``PRISM_BENCH_THREADS=1`` it also appends, per step, each thread's CPU time so far (a JSON
line to ``threads-<pid>-<pass>.jsonl``: thread name -> ns, threads of one name summed), read from
``/proc/self/task/<tid>/schedstat`` (nanoseconds; ``stat``'s clock ticks where it is missing). A
Python thread is named by ``threading`` (prism names its own), any other by its ``comm`` (gloo's,
NCCL's, the CUDA driver's). Off by default: reading ~10 threads costs ~0.1–0.2 ms per step."""

import os
import re
import time

_DIR = os.environ.get("PRISM_BENCH_STEP_DIR")
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def _thread_cpu_ns() -> dict[str, int]:
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{tid}/"
        try:
            try:
                with open(base + "schedstat") as f:
                    ns = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                with open(base + "stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ns = int((int(fields[11]) + int(fields[12])) * _TICK_NS)
            name = names.get(int(tid))
            if name is None:
                with open(base + "comm") as f:
                    name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        name = re.sub(r"\d+", "#", name)  # one row per kind of thread (per group, per stream, ...)
        out[name] = out.get(name, 0) + ns
    return out


def _install(directory: str, threads: bool) -> None:
    import json

    from torch.optim.optimizer import register_optimizer_step_post_hook

    def step_end(*_args, **_kwargs) -> None:
        # The worker sets PRISM_RECORD_PASS after this module ran: read it when a step ends.
        stem = f"{os.getpid()}-{os.environ.get('PRISM_RECORD_PASS', 'run')}"
        with open(os.path.join(directory, f"pid-{stem}.txt"), "a") as f:
            f.write(f"{time.perf_counter_ns()} {time.process_time_ns()}\n")
        if threads:
            with open(os.path.join(directory, f"threads-{stem}.jsonl"), "a") as f:
                f.write(json.dumps(_thread_cpu_ns()) + "\n")

    register_optimizer_step_post_hook(step_end)


if _DIR:
    _install(_DIR, os.environ.get("PRISM_BENCH_THREADS") == "1")
