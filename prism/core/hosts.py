"""Where a supervisor's processes run: on this host (:class:`LocalHost`), or on other nodes through
the agents of a multi-node run (``prism.rpc.agents.AgentPool``, docs/slurm.md).

A command runs as it always does; the CLI of a multi-node run installs the agent pool for the
command's duration with :func:`use_process_host`, and every :class:`~prism.core.supervise.Supervisor`
the command creates starts its processes there. Roles that open a listening endpoint ask
:func:`reachable_host` for the address that processes on other nodes can dial.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["Process", "ProcessHost", "LocalHost", "current_process_host", "use_process_host", "reachable_host"]


class Process(Protocol):
    """What a supervisor needs of a running process (a subset of ``subprocess.Popen``)."""

    pid: int
    where: str
    """The node it runs on, for messages ("" on this host)."""
    lost_reason: str
    """Why it is gone without an exit status of its own (its node was lost); "" otherwise."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to its process group (it runs in its own session)."""


class ProcessHost(Protocol):
    multi_node: bool
    reachable_host: str
    """The address other processes of the run dial to reach a server in this process."""

    def start(self, key: int, argv: Sequence[str], env: dict[str, str], *, log_path: Path, role: str,
              slot: int | None, preload: Sequence[str] = ()) -> Process:
        """Start a process; ``role`` is "sandbox" (a rank worker) or "assistant" (a replayer);
        ``slot`` places a rank worker on that slot's node; ``preload``: the node may fork a
        ``python -m`` process of these modules from a server that imported them
        (:mod:`prism.core.forkserver`)."""

    def settle(self) -> None:
        """Called when a process failed, before it is blamed: wait until every node that went
        silent is either back or declared lost, so that a lost node is named rather than a peer
        that failed on the broken connection."""


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the calling process gets SIGKILL when its parent (thread) exits."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalProcess:
    where = ""
    lost_reason = ""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._p = popen
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._p.wait(timeout=timeout)

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)


def start_local(argv: Sequence[str], env: dict[str, str], log_path: Path, *, stdin=None,
                pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """A process in its own session that dies with its parent (PR_SET_PDEATHSIG, set between fork
    and exec: no orphan survives even a SIGKILL of the parent), output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(list(argv), env=env, stdin=stdin, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent, pass_fds=tuple(pass_fds))


class LocalHost:
    multi_node = False
    reachable_host = "127.0.0.1"

    def start(self, key: int, argv: Sequence[str], env: dict[str, str], *, log_path: Path, role: str = "sandbox",
              slot: int | None = None, preload: Sequence[str] = ()) -> LocalProcess:
        """Afresh: a local :class:`~prism.core.supervise.Supervisor` forks from its own servers."""
        return LocalProcess(start_local(argv, env, log_path))

    def settle(self) -> None:
        pass


_LOCAL = LocalHost()
_current: ProcessHost = _LOCAL


def current_process_host() -> ProcessHost:
    return _current


@contextlib.contextmanager
def use_process_host(host: ProcessHost) -> Iterator[ProcessHost]:
    global _current
    previous, _current = _current, host
    try:
        yield host
    finally:
        _current = previous


def reachable_host() -> str:
    return _current.reachable_host
