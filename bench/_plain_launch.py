"""Start W processes of a script as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, OMP_NUM_THREADS=1): the plain, prism-free side of the overhead benchmarks."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prism.core.supervise import package_env

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_plain(script: Path, args, world: int, *, env: dict[str, str] | None = None, wrapper: list[str] = (),
                 timeout_s: float = 600.0, retries: int = 1, on_retry: Callable[[], None] | None = None) -> None:
    """Run ``python [*wrapper] script *args`` as ranks 0..world-1 in the script's directory; raise
    with the failing rank's stderr.

    A run whose rank fails is started again up to ``retries`` times (after ``on_retry()``, which
    clears what the failed run wrote): torch 2.13's gloo now and then aborts a plain rank as it
    exits ("terminate called without an active exception", 1 in 6 runs of the ping-pong on 2
    cores), and one such abort cost a benchmark call every figure after it. A rank that does not
    finish in time is not retried."""
    for attempt in range(retries + 1):
        try:
            _launch_once(script, args, world, env=env, wrapper=wrapper, timeout_s=timeout_s)
            return
        except _RankFailed as e:
            if attempt == retries:
                raise RuntimeError(str(e)) from None
            log.warning("%s; starting the plain run again", e)
            if on_retry is not None:
                on_retry()


class _RankFailed(Exception):
    pass


def _launch_once(script: Path, args, world: int, *, env: dict[str, str] | None, wrapper, timeout_s: float) -> None:
    port = _free_port()
    procs = []
    for rank in range(world):
        penv = package_env({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                            "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(env or {})})
        procs.append(subprocess.Popen([sys.executable, *wrapper, str(script), *args], env=penv,
                                      cwd=str(Path(script).parent), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout_s
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"plain run of {script}: rank {rank} did not finish in {timeout_s} s") from None
        if p.returncode:
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            raise _RankFailed(f"plain run of {script}: rank {rank} exited {p.returncode}:\n{err.decode()[-2000:]}")
