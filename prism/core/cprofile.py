"""``PRISM_CPROFILE_DIR``: a cProfile file per thread of prism's own hot loops, for finding where
an emulated op's CPU time goes (docs/emulate.md, "the emulator's own cost").

cProfile sees only the thread that enabled it, and prism's per-op work runs on its own threads
(the live engine's channel threads, the replayer's channel threads), so each such thread, and the
script's main thread, wraps its body in :func:`profiled`. With the variable unset this costs one
environment lookup per thread. The timer is the thread's CPU clock (``time.thread_time``): on a
loaded host wall time mostly measures waiting, and the waits (gloo, queues) show up as calls
anyway, with their counts. Read the files with ``python -m pstats FILE`` or merge them with
``pstats.Stats(*files)``.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ENV", "profiled"]

ENV = "PRISM_CPROFILE_DIR"


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the body on this thread into ``$PRISM_CPROFILE_DIR/<name>-<pid>-<thread>.prof``."""
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        Path(out).mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in threading.current_thread().name)
        prof.dump_stats(str(Path(out) / f"{name}-{os.getpid()}-{safe}.prof"))
