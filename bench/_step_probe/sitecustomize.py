"""bench/record_overhead.py's step probe, loaded by every Python process that has this folder on
PYTHONPATH and PRISM_BENCH_STEP_DIR set: after each ``optimizer.step`` it appends the wall clock
(``perf_counter_ns``) and the process's CPU time (``process_time_ns``, all threads) to
``$PRISM_BENCH_STEP_DIR/pid-<pid>-<pass>.txt`` (``<pass>``: ``PRISM_RECORD_PASS`` — ``memory`` or
``timed`` under a two-pass ``prism record`` — else ``run``). The same probe in a plain run and under ``prism record``,
so both sides measure a step the same way."""

import os
import time

_DIR = os.environ.get("PRISM_BENCH_STEP_DIR")


def _install(directory: str) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def step_end(*_args, **_kwargs) -> None:
        # The worker sets PRISM_RECORD_PASS after this module ran: read it when a step ends.
        path = os.path.join(directory, f"pid-{os.getpid()}-{os.environ.get('PRISM_RECORD_PASS', 'run')}.txt")
        with open(path, "a") as f:
            f.write(f"{time.perf_counter_ns()} {time.process_time_ns()}\n")

    register_optimizer_step_post_hook(step_end)


if _DIR:
    _install(_DIR)
