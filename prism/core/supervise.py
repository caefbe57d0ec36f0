"""Start and watch a set of worker processes; the first failure stops them all.

Each process has a key (the logical rank, or a key past the world for a replayer) and a name
that errors use ("rank 3", "replayer 0"). When several processes are found dead at once, the one
killed by a signal is reported, else the one whose program failed first (the oldest error file):
its peers exit with an error only because it vanished.

Workers run in their own sessions and die with the supervisor (PR_SET_PDEATHSIG, set between
fork and exec), so no orphan survives even a SIGKILL of the supervisor. A failing worker's
traceback is read from its error file (``workerspec.error_path``) or, failing that, the tail of
its log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import RankFailedError
from .forkserver import ForkServerError, ForkServerPool, fork_server_enabled, fork_server_wanted, preloaded_module, shared_server
from .hosts import LocalHost, Process, ProcessHost, current_process_host
from .workerspec import error_path

__all__ = ["Supervisor", "package_env"]

log = logging.getLogger(__name__)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def package_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker: ours, plus ``extra``, with this prism importable."""
    env = dict(os.environ)
    env.update(extra or {})
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Supervisor:
    """Owns worker processes keyed by logical rank."""

    def __init__(self, *, error_dir: str | Path, log_dir: str | Path, host: ProcessHost | None = None,
                 preload: Sequence[str] = ()) -> None:
        """``preload``: modules whose ``python -m`` processes start from a fork server that has
        imported them (:mod:`prism.core.forkserver`), on this host or on a multi-node run's nodes
        (their agents); only for processes that will not use CUDA."""
        self.error_dir = Path(error_dir)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.host = host or current_process_host()
        self.procs: dict[int, Process] = {}
        self.names: dict[int, str] = {}
        local = isinstance(self.host, LocalHost)
        self._preload = tuple(preload) if preload and local and fork_server_enabled() else ()
        self._node_preload = tuple(preload) if preload and not local and fork_server_wanted() else ()
        self._servers = ForkServerPool()  # off the main thread, where shared_server gives none

    def start(self, rank: int, argv: Sequence[str], env: dict[str, str], *, name: str = "", role: str = "sandbox",
              slot: int | None = None) -> Process:
        """Start the process of key ``rank``; ``name`` (default "rank <rank>") is how errors name it.
        ``role`` and ``slot`` place it on a node of a multi-node run (:mod:`prism.core.hosts`)."""
        log_path = self.log_dir / f"rank-{rank:05d}.log"
        proc = self._start_forked(argv, env, log_path)
        if proc is None:
            proc = self.host.start(rank, argv, env, log_path=log_path, role=role, slot=slot,
                                   preload=self._node_preload)
        self.procs[rank] = proc
        self.names[rank] = (name or f"rank {rank}") + (f" on {proc.where}" if proc.where else "")
        return proc

    def _start_forked(self, argv: Sequence[str], env: dict[str, str], log_path: Path) -> Process | None:
        """``argv`` started by the fork server of ``env``; None when it is not a preloaded
        ``python -m`` command (or the server failed: the process then starts afresh)."""
        module = preloaded_module(argv, self._preload)
        if module is None:
            return None
        try:
            server = shared_server(self._preload, env)
            if server is None:  # off the main thread: a server of this supervisor's own
                return self._servers.start(self._preload, env, module, argv[3:], log_path)
            return server.start(module, argv[3:], log_path)
        except ForkServerError as e:
            log.warning("%s; starting processes afresh", e)
            self._preload = ()
            return None

    def failure_text(self, rank: int, code: int, lost_reason: str = "") -> str:
        if lost_reason:
            return lost_reason
        err = error_path(self.error_dir, rank)
        if err.exists():
            return err.read_text()
        log_file = self.log_dir / f"rank-{rank:05d}.log"
        tail = log_file.read_text(errors="replace")[-4000:] if log_file.exists() else ""
        reason = f"killed by signal {-code} ({_signal_name(-code)})" if code < 0 else f"exited with code {code}"
        return f"{reason}; last output:\n{tail}" if tail else reason

    def poll(self) -> list[int]:
        """Ranks that finished successfully since the last call; raises on the first failure."""
        done, failed = self._reap()
        if failed:
            self.host.settle()  # a lost node is blamed, not a peer that failed on the broken connection
            more_done, more_failed = self._reap()
            done, failed = done + more_done, failed + more_failed
            lost = {rank: reason for rank, _, reason in failed if reason}
            rank, code = self._first_failure([(r, c) for r, c, _ in failed])
            text = self.failure_text(rank, code, lost.get(rank, ""))
            self.kill_all()
            raise RankFailedError(rank, text, exit_code=code, part=self.names.get(rank, ""))
        return [rank for rank, _ in done]

    def _reap(self) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
        done, failed = [], []
        for rank, p in list(self.procs.items()):
            code = p.poll()
            if code is None:
                continue
            del self.procs[rank]
            if code != 0:
                failed.append((rank, code, p.lost_reason))
            else:
                done.append((rank, code))
        return done, failed

    def _first_failure(self, failed: list[tuple[int, int]]) -> tuple[int, int]:
        """The process that failed first among ``failed`` and those still running: one killed by
        a signal, else the one whose error file is the oldest (a program that raised writes it at
        once; its peers write theirs later, when they see their connections to it close)."""
        killed = [f for f in failed if f[1] < 0]
        if killed:
            return min(killed)
        written = []
        for rank, code in [*failed, *((r, None) for r in self.procs)]:
            with contextlib.suppress(FileNotFoundError):
                written.append((error_path(self.error_dir, rank).stat().st_mtime_ns, rank, code))
        if not written:
            return min(failed)
        _, rank, code = min(written)
        if code is None:  # it is exiting: give it a moment for its exit code
            proc = self.procs.pop(rank)
            try:
                code = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.procs[rank] = proc  # kill_all stops it
                code = 1
        return rank, code

    def wait_all(
        self,
        *,
        timeout_s: float,
        on_done: Callable[[int], None] | None = None,
        tick: Callable[[], None] | None = None,
        interval_s: float = 0.02,
    ) -> None:
        """Until every process has exited; raises on failure or timeout (after killing all)."""
        deadline = time.monotonic() + timeout_s
        while self.procs:
            time.sleep(interval_s)
            for rank in self.poll():
                if on_done:
                    on_done(rank)
            if tick:
                tick()
            if time.monotonic() > deadline and self.procs:
                stuck = sorted(self.procs)
                self.kill_all()
                raise RankFailedError(stuck[0], f"timed out after {timeout_s:.0f} s; ranks still running: {stuck}")

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.signal_group(signal.SIGKILL)
                p.wait()
        self.procs.clear()

    def close(self) -> None:
        self.kill_all()
        self._servers.close()  # a shared server (forkserver.shared_server) stays

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
