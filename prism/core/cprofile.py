"""``PRISM_CPROFILE_DIR``: cProfile files of prism's own hot loops, for finding where an emulated
op's CPU time goes (docs/emulate.md, "the emulator's own cost").

Up to Python 3.11 cProfile sees only the thread that enabled it, and prism's per-op work runs on
its own threads (the live engine's channel threads, the replayer's channel threads), so each such
thread, and the script's main thread, wraps its body in :func:`profiled` and writes its own file
``<name>-<pid>-<thread>.prof``. The timer is the thread's CPU clock (``time.thread_time``): on a
loaded host wall time mostly measures waiting, and the waits (gloo, queues) show up as calls
anyway, with their counts.

From Python 3.12 on cProfile is built on ``sys.monitoring``: one profiler per process, and it sees
every thread's calls (a second ``enable`` raises "Another profiling tool is already active"). There
the first thread to enter :func:`profiled` profiles the whole process into
``<name>-<pid>-process.prof`` with the wall clock (one thread's CPU clock cannot time another
thread's calls: mixed, it gives negative times), and the others run unprofiled. The device
machines run Python 3.12.

With the variable unset this costs one environment lookup per thread. Read the files with
``python -m pstats FILE`` or merge them with ``pstats.Stats(*files)``.
"""

from __future__ import annotations

import contextlib
import cProfile
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ENV", "profiled"]

ENV = "PRISM_CPROFILE_DIR"

PROCESS_WIDE = sys.version_info >= (3, 12)
"""Whether cProfile profiles every thread of the process (``sys.monitoring``)."""

log = logging.getLogger(__name__)

_process_profile = threading.Lock()
"""Held by the one :func:`profiled` body that profiles the process (``PROCESS_WIDE``)."""


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the body into ``$PRISM_CPROFILE_DIR`` (see the module docstring for which file)."""
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    if PROCESS_WIDE:
        if not _process_profile.acquire(blocking=False):
            yield  # another thread's profile covers this one
            return
        prof, suffix = cProfile.Profile(), "process"
    else:
        prof = cProfile.Profile(time.thread_time)
        suffix = "".join(c if c.isalnum() or c in "-_." else "_" for c in threading.current_thread().name)
    try:
        prof.enable()
    except ValueError as e:  # another profiler (the user's own) is active
        log.warning("%s=%s: not profiling %s: %s", ENV, out, name, e)
        if PROCESS_WIDE:
            _process_profile.release()
        yield
        return
    try:
        yield
    finally:
        prof.disable()
        if PROCESS_WIDE:
            _process_profile.release()
        Path(out).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(Path(out) / f"{name}-{os.getpid()}-{suffix}.prof"))
