"""Errors the user can cause. Every one names the place: the key, the rank, the op, the file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CrashSite",
    "crash_site",
    "PrismError",
    "ConfigError",
    "RunDirError",
    "IntegrityError",
    "GraphError",
    "RankFailedError",
    "RankOOMError",
    "MismatchError",
    "HangError",
]


class PrismError(ValueError):
    """Base of every error prism raises for bad input or a failed run."""


class ConfigError(PrismError):
    """A job file is wrong; the message starts with the dotted key path."""

    def __init__(self, key: str, message: str, *, source: str | None = None) -> None:
        self.key = key
        self.detail = message
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


class RunDirError(PrismError):
    """A run directory is missing, incomplete or corrupt (names the file)."""


class IntegrityError(RunDirError):
    """A file prism wrote earlier is missing, truncated, or no longer matches its checksum.

    ``path``: the file; ``problem``: what is wrong ("missing", "truncated (N of M bytes)",
    "sha256 mismatch ...", "corrupt ..."); ``remedy``: the command that writes it again."""

    def __init__(self, path: object, problem: str, remedy: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.remedy = remedy
        super().__init__(f"{self.path}: {problem}; {remedy}" if remedy else f"{self.path}: {problem}")


class GraphError(PrismError):
    """A PrismTrace graph is inconsistent (names the rank and the op)."""


class RankFailedError(PrismError):
    """A process of the run failed (a logical rank's program raised, or a rank or a replayer
    died); carries its supervisor key, what it is (``part``: "rank 3", "replayer 0") and its
    traceback or exit reason."""

    def __init__(self, rank: int, traceback_text: str, *, exit_code: int | None = None, part: str = "") -> None:
        self.rank = rank
        self.traceback_text = traceback_text
        self.exit_code = exit_code
        self.part = part or f"rank {rank}"
        detail = traceback_text.rstrip() or f"exited with code {exit_code}"
        super().__init__(f"{self.part} failed:\n{detail}")


class RankOOMError(RankFailedError):
    """A rank ran out of memory (a device OOM, or the job's ``memory_cap_bytes``). ``rank`` is the
    first such rank; ``ooms`` holds every rank's ``OomReport`` (``prism.core.workerspec``)."""

    def __init__(self, rank: int, traceback_text: str, *, ooms: tuple = (), exit_code: int | None = None) -> None:
        super().__init__(rank, traceback_text, exit_code=exit_code)
        self.ooms = ooms

    @property
    def oom(self):
        """The OomReport of ``rank``."""
        return next(o for o in self.ooms if o.rank == self.rank)


class MismatchError(PrismError):
    """Ranks disagree about which collective comes next (a deadlock in the real job)."""


class HangError(PrismError):
    """A run made no progress until its timeout; the message holds every rank's pending op."""


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\] .*?\. (?=[A-Z])")
"""c10's ``[enforce fail at alloc_cpu.cpp:127] err == 0. `` before the message that explains."""
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ",
                  Path(__file__).resolve().parents[1].as_posix() + "/")
"""Paths that are not the job's own code: installed packages, the standard library, prism."""


@dataclass(frozen=True)
class CrashSite:
    """Where a rank's program raised, read from its traceback."""

    error: str
    """The exception line, without c10's enforce prefix."""
    call: str
    """The outermost ``torch.distributed`` function on the stack (``recv_object_list``), or ""."""
    site: str
    """The innermost frame of the job's own code (``train.py:88``), or ""."""


def crash_site(traceback_text: str) -> CrashSite:
    """The exception, the c10d call it came through and the job's line that made it."""
    lines = traceback_text.strip().splitlines()
    error = _ENFORCE.sub("", lines[-1].strip()) if lines else ""
    call = site = ""
    for line in lines:
        m = _FRAME.match(line)
        if m is None:
            continue
        path = m["file"].replace("\\", "/")
        if path.endswith("torch/distributed/distributed_c10d.py"):
            call = call or m["func"]  # the outermost: the API the job's code (or its library) called
        elif not any(part in path for part in _LIBRARY_PARTS):
            site = f"{path.rsplit('/', 1)[-1]}:{m['line']}"
    return CrashSite(error, call, site)
