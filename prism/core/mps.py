"""A private CUDA MPS server for the processes of one emulation or calibration slice.

Without MPS, the kernels of two processes on one GPU are time-sliced: on the ``ipc`` path (a
sandbox rank and its replayer on one GPU) every answer of the replayer waits for the sandbox's
time slice to end. Measured on one H200 (bench/gpu_one.py, DDP with 805 MB of gradients, W=2,
rank 0 emulated): 259.8 ms per step time-sliced, 112.4 ms under MPS, against 98.9 ms for the real
2-GPU run. :func:`private_mps` starts ``nvidia-cuda-mps-control -d`` with its pipe and log
directories in a fresh temporary directory (nothing shared with other users' servers), points
the processes started inside the ``with`` at it through ``CUDA_MPS_PIPE_DIRECTORY`` /
``CUDA_MPS_LOG_DIRECTORY`` in this process's environment (children inherit it), and quits the
server on exit. It changes no setting of the GPU (compute mode, MIG): processes outside it keep
running time-sliced beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from .errors import PrismError

__all__ = ["private_mps", "MPS_CONTROL"]

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@contextlib.contextmanager
def private_mps() -> Iterator[dict[str, str]]:
    """Run the body with a private MPS server; yields the environment its clients need."""
    control = shutil.which(MPS_CONTROL)
    if control is None:
        raise PrismError(f"--mps: {MPS_CONTROL} is not on PATH (it ships with the NVIDIA driver); "
                         f"run without --mps to share the GPU time-sliced")
    # A short path: the server's Unix socket must fit in sockaddr_un (108 bytes).
    root = tempfile.mkdtemp(prefix="prism-mps-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")}
    for d in env.values():
        os.makedirs(d)
    started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if started.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise PrismError(f"--mps: {MPS_CONTROL} -d failed ({started.returncode}): "
                         f"{(started.stderr or started.stdout).strip()[-500:]}")
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(env)
    log.info("private MPS server: %s", env["CUDA_MPS_PIPE_DIRECTORY"])
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            quit_ = subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True,
                                   text=True, check=False, timeout=60)
            if quit_.returncode != 0:
                log.warning("MPS server did not quit cleanly: %s", (quit_.stderr or quit_.stdout).strip()[-300:])
        except subprocess.TimeoutExpired:
            log.warning("MPS server did not quit within 60 s (pipe directory %s)", env["CUDA_MPS_PIPE_DIRECTORY"])
        shutil.rmtree(root, ignore_errors=True)
