"""Copied into a probed tree as ``prism/pprobe.py`` by ``apply.py``: ``mark(name)`` appends
``<perf_counter_ns> <thread> <name>`` to ``$PRISM_PAIR_PROBE/<pid>.txt`` (nothing when unset)."""
import os
import threading
import time

_DIR = os.environ.get("PRISM_PAIR_PROBE")
_file = None
_lock = threading.Lock()


def mark(name: str) -> None:
    global _file
    if not _DIR:
        return
    with _lock:
        if _file is None:
            _file = open(os.path.join(_DIR, f"{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115
        _file.write(f"{time.perf_counter_ns()} {threading.current_thread().name} {name}\n")
