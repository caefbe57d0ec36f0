"""A fork server: one process imports torch and a worker module once, then forks a child per rank.

A rank worker spends ~1.5 s of CPU importing torch before the script's first line; a run of W ranks
on a small host pays it W times (8 ranks on 2 cores: ~6 s of a launch). Through a fork server it is
paid once per command (the supervisors of a process's main thread share a server per environment,
:func:`shared_server`; a supervisor of another thread keeps its own; each holder keeps them in a
:class:`ForkServerPool`, which ends idle servers beyond its limit and never a busy one): the server
(``python -m prism.core.forkserver MODULE...``) imports the modules, then for each request forks a child that becomes ``python -m MODULE ARGS`` as a process
started afresh would: its own session, dying with its parent (PR_SET_PDEATHSIG), output to its log,
stdin from /dev/null, the request's working directory, fresh random state, default signal handlers.
The module named in a request runs as ``__main__`` (runpy); the server imported its dependencies
but not the module itself, so it runs once.

Only for processes that will not use CUDA: a CUDA context does not survive a fork, and the server
must never create one (``Supervisor(preload=...)`` is passed by callers for CPU jobs only). The
server is single-threaded at every fork. ``PRISM_FORK_SERVER=0`` starts every process afresh, as
does a host without ``setproctitle`` (a dependency; the GPU machines run from the checkout without it).

Protocol: requests are JSON lines on the server's stdin (``{"id", "module", "args", "cwd", "log"}``);
replies are lines on a pipe: ``started ID PID``, ``failed ID MESSAGE`` and ``exited PID CODE``
(CODE as ``subprocess.Popen.returncode``: negative for a signal). EOF on stdin ends the server.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from .hosts import die_with_parent, start_local

__all__ = ["ForkServer", "ForkServerPool", "ForkedProcess", "ForkServerError", "fork_server_enabled", "shared_server",
           "close_shared_servers"]

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 300.0
"""How long a request may wait for the server's answer (its first one waits for its imports)."""


_TITLE_SPACE = 1024
"""Bytes of argv a child's process title may use (titles are written over the server's argv only,
so that /proc/PID/environ, where runs find their processes, stays intact)."""


class ForkServerError(RuntimeError):
    """The fork server died or refused a request."""


def fork_server_wanted() -> bool:
    """False when ``PRISM_FORK_SERVER=0``: every process starts afresh, here and on a run's nodes."""
    return os.environ.get("PRISM_FORK_SERVER", "1") != "0"


def fork_server_enabled() -> bool:
    """Wanted, and ``setproctitle`` installed on this host: without it a forked rank would show the
    server's command line, and runs find their processes by theirs."""
    return fork_server_wanted() and importlib.util.find_spec("setproctitle") is not None


def preloaded_module(argv: Sequence[str], preload: Sequence[str]) -> str | None:
    """The module of a ``python -m MODULE`` command line when it is one of ``preload`` and runs
    this host's Python (what a fork server of this process would run); None otherwise."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in preload:
        return argv[2]
    return None


# ------------------------------------------------------------------------------------- client side


class ForkedProcess:
    """A child of the fork server, as a supervisor sees it (:class:`prism.core.hosts.Process`)."""

    where = ""
    lost_reason = ""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid

    def poll(self) -> int | None:
        self._server.drain(0.0)
        return self._server.codes.get(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self._server.codes.get(self.pid)) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"fork server child {self.pid}", timeout)
            self._server.drain(0.1 if left is None else min(0.1, left))
        return code

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)


class ForkServer:
    """The client of one server process: ``start`` forks a child there."""

    def __init__(self, preload: Sequence[str], env: dict[str, str], log_path: Path | None = None) -> None:
        """``log_path``: the server's own output (default: a temporary file, deleted at close)."""
        self._remove_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="prism-fork-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self._replies_r, replies_w = os.pipe()
        # The blank argument reserves room in the server's argv for its children's titles.
        argv = [sys.executable, "-m", __name__, str(replies_w), " " * _TITLE_SPACE, *preload]
        self._proc = start_local(argv, env, log_path, stdin=subprocess.PIPE, pass_fds=(replies_w,))
        os.close(replies_w)
        self._log_path = log_path
        self._buffer = b""
        self._next_id = 0
        self._started: dict[int, int | str] = {}
        self.codes: dict[int, int] = {}
        """pid -> exit code of every child that exited."""
        self._children: set[int] = set()
        self._closed = False
        self._lock = threading.RLock()

    def start(self, module: str, args: Sequence[str], log_path: Path) -> ForkedProcess:
        request_id, self._next_id = self._next_id, self._next_id + 1
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")  # there on return, as subprocess.Popen's log is
        line = json.dumps({"id": request_id, "module": module, "args": list(args), "cwd": os.getcwd(),
                           "log": str(log_path)}) + "\n"
        try:
            with self._lock:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:  # ValueError: closed meanwhile
            raise ForkServerError(self._died_text()) from e
        deadline = time.monotonic() + _START_TIMEOUT_S
        while request_id not in self._started:
            if self._closed:
                raise ForkServerError(self._died_text())
            if time.monotonic() > deadline:
                raise ForkServerError(f"the fork server did not start {module} in {_START_TIMEOUT_S:.0f} s")
            self.drain(0.1)
        pid = self._started.pop(request_id)
        if isinstance(pid, str):
            raise ForkServerError(f"the fork server could not start {module}: {pid}")
        self._children.add(pid)
        return ForkedProcess(self, pid)

    def drain(self, timeout: float) -> None:
        """Read the server's replies that arrive within ``timeout`` seconds."""
        with self._lock:
            if self._closed:
                return
            ready, _, _ = select.select([self._replies_r], [], [], timeout)
            if ready:
                self._read()

    def _read(self) -> None:
        chunk = os.read(self._replies_r, 65536)
        if not chunk:  # the server is gone; its children die with it (PR_SET_PDEATHSIG)
            self._closed = True
            for pid in self._children - set(self.codes):
                self.codes[pid] = -signal.SIGKILL
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            kind, a, b = raw.decode().split(" ", 2)
            if kind == "started":
                self._started[int(a)] = int(b)
            elif kind == "failed":
                self._started[int(a)] = b
            elif kind == "exited":
                self.codes[int(a)] = int(b)

    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def idle(self) -> bool:
        """No child of this server is running (closing it would stop none)."""
        self.drain(0.0)
        return self._children <= set(self.codes)

    def _died_text(self) -> str:
        tail = self._log_path.read_text(errors="replace")[-2000:] if self._log_path.exists() else ""
        return f"the fork server exited (code {self._proc.poll()})" + (f"; its output:\n{tail}" if tail else "")

    def close(self) -> None:
        """End the server. It kills its running children and their process groups and reaps them
        first, so none of them runs when this returns; each is reported killed."""
        if self._proc.stdin.closed:
            return
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        with self._lock:
            with contextlib.suppress(OSError):  # the exits it reported before it ended
                while not self._closed and select.select([self._replies_r], [], [], 0)[0]:
                    self._read()
            for pid in self._children - set(self.codes):  # else a wait on one would never end
                self.codes[pid] = -signal.SIGKILL
            with contextlib.suppress(OSError):
                os.close(self._replies_r)
            self._closed = True
        if self._remove_log:
            self._log_path.unlink(missing_ok=True)


class ForkServerPool:
    """Fork servers kept for later starts, one per preload and environment (a server holds its
    preloaded imports, torch's ~1.5 s of CPU). A new server first ends the dead ones, then the
    least recently used idle ones until there is room for it under ``max_servers``. A busy server
    is never ended (its running children would die with it): while all are busy, the pool holds
    more than ``max_servers``. Thread-safe: :meth:`start` holds the pool until its child runs, so no
    other thread ends that server while it is idle in between."""

    def __init__(self, max_servers: int = 4) -> None:
        self.max_servers = max_servers
        self._servers: OrderedDict[tuple[tuple[str, ...], frozenset[tuple[str, str]]], ForkServer] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, preload: Sequence[str], env: dict[str, str]) -> ForkServer:
        """The live server of ``preload`` and ``env``, started if there is none (a dead one is replaced)."""
        with self._lock:
            return self._get(preload, env)

    def start(self, preload: Sequence[str], env: dict[str, str], module: str, args: Sequence[str],
              log_path: Path) -> ForkedProcess:
        """``python -m module args`` forked by the server of ``preload`` and ``env``."""
        with self._lock:
            return self._get(preload, env).start(module, args, log_path)

    def _get(self, preload: Sequence[str], env: dict[str, str]) -> ForkServer:
        key = (tuple(preload), frozenset(env.items()))
        server = self._servers.get(key)
        if server is not None and server.alive():
            self._servers.move_to_end(key)
            return server
        self._make_room()
        server = self._servers[key] = ForkServer(preload, env)
        return server

    def _make_room(self) -> None:
        for key in [k for k, s in self._servers.items() if not s.alive()]:
            self._servers.pop(key).close()
        for key in list(self._servers):  # least recently used first
            if len(self._servers) < self.max_servers:
                break
            if self._servers[key].idle():
                self._servers.pop(key).close()

    def close(self) -> None:
        """End every server (a child still running dies with its server)."""
        with self._lock:
            while self._servers:
                self._servers.popitem()[1].close()


_SHARED_MAX = 4
_shared = ForkServerPool(_SHARED_MAX)


def shared_server(preload: Sequence[str], env: dict[str, str]) -> ForkServer | None:
    """This process's server for ``preload`` and ``env``, kept for later launches (a command that
    launches several times pays the server's imports once); None off the main thread: a server dies
    with the thread that started it (PR_SET_PDEATHSIG), and only the main thread lives as long as
    the process. Idle servers beyond the last ``_SHARED_MAX`` end (a busy one is never ended); all
    end at exit."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return _shared.get(preload, env)


@atexit.register
def close_shared_servers() -> None:
    """End every shared server (at exit)."""
    _shared.close()


# ------------------------------------------------------------------------------------- server side


def _preload(modules: Sequence[str]) -> None:
    """Import each module's dependencies: the module itself is dropped again, so that runpy runs
    it as ``__main__`` once, as ``python -m`` does."""
    for name in modules:
        importlib.import_module(name)
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules:
            with contextlib.suppress(AttributeError):
                delattr(sys.modules[parent], child)


def _become_child(request: dict, fds: Sequence[int], server_pid: int) -> None:
    """In the forked child: the process environment that ``python -m MODULE`` would have had."""
    import random  # noqa: PLC0415

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the only handler the server changed
    os.setsid()
    die_with_parent()  # the server; it dies with its supervisor in turn
    if os.getppid() != server_pid:  # the server died before the line above
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in {null, out, *fds} - {0, 1, 2}:
        with contextlib.suppress(OSError):
            os.close(fd)
    if sys.path and sys.path[0] == os.getcwd():  # python -m puts its start directory first
        sys.path[0] = request["cwd"]
    os.chdir(request["cwd"])
    random.seed()  # fresh entropy, as a new interpreter has (numpy's legacy global state too)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv = ["-m", *request["args"]]
    if _setproctitle is not None:  # what ps, psutil and py-spy show: the command it stands for
        _setproctitle.setproctitle(" ".join([sys.executable, "-m", request["module"], *request["args"]]))
    os.environ.pop("SPT_NOENV", None)


_setproctitle = None


def _end_children(children: set[int], reply: Callable[[str], None]) -> None:
    """Kill the running children (and their process groups) and report each exit once it is
    reaped: when the client's close returns, none of them runs any more (their death signal from
    this process's exit would only be delivered, not completed)."""
    for pid in children:
        for kill in (os.killpg, os.kill):  # a child that has not yet called setsid has no group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    for pid in sorted(children):
        with contextlib.suppress(ChildProcessError, BrokenPipeError):  # BrokenPipe: the client is gone
            _, status = os.waitpid(pid, 0)
            reply(f"exited {pid} {os.waitstatus_to_exitcode(status)}")
    children.clear()


def _serve(replies: int, preload: Sequence[str]) -> dict | None:
    """The server's loop; returns the request of a forked child (in the child), None at EOF."""
    global _setproctitle
    os.environ["SPT_NOENV"] = "1"  # setproctitle keeps off the environ (removed again in each child)
    with contextlib.suppress(ImportError):  # checked by fork_server_enabled; a server started anyway runs without it
        import setproctitle as _setproctitle  # noqa: PLC0415
    _preload(preload)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    requests = sys.stdin.buffer
    children: set[int] = set()
    pending = b""

    def reply(text: str) -> None:
        os.write(replies, (text + "\n").encode())

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            reply(f"exited {pid} {os.waitstatus_to_exitcode(status)}")

    stdin_fd = requests.fileno()
    while True:
        ready, _, _ = select.select([stdin_fd, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        reap()
        if stdin_fd not in ready:
            continue
        chunk = os.read(stdin_fd, 65536)
        if not chunk:
            _end_children(children, reply)
            return None
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            request = json.loads(raw)
            sys.stdout.flush()
            sys.stderr.flush()
            server_pid = os.getpid()
            try:
                pid = os.fork()
            except OSError as e:
                reply(f"failed {request['id']} {e}")
                continue
            if pid == 0:
                _become_child(request, (stdin_fd, replies, wake_r, wake_w), server_pid)
                return request
            children.add(pid)
            reply(f"started {request['id']} {pid}")


def main(argv: Sequence[str]) -> int:
    replies, preload = int(argv[0]), argv[2:]  # argv[1]: the room for titles
    request = _serve(replies, preload)
    if request is None:
        return 0
    import runpy  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    # From here on this process is the child: the module runs as ``python -m`` would run it, and
    # the interpreter's own exit (threads joined, atexit, flush) ends it.
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except Exception as e:  # noqa: BLE001 - printed as the interpreter would, without this module's frames
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
