"""Start W processes of a script as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, OMP_NUM_THREADS=1): the plain, prism-free side of the overhead benchmarks."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from prism.core.supervise import package_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_plain(script: Path, args, world: int, *, env: dict[str, str] | None = None, wrapper: list[str] = (),
                 timeout_s: float = 600.0) -> None:
    """Run ``python [*wrapper] script *args`` as ranks 0..world-1 in the script's directory; raise
    with the failing rank's stderr."""
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
            raise RuntimeError(f"plain run of {script}: rank {rank} exited {p.returncode}:\n{err.decode()[-2000:]}")
