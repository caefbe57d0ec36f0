"""Multi-node runs: the head's agent pool and the agent loop (docs/slurm.md).

Each Slurm task on a sandbox or assistant node runs :func:`run_agent`: it polls the head's
:class:`AgentPool` (node 0) every ``POLL_INTERVAL_S``, starts the processes the pool hands it,
signals them when asked, and reports their exits. The pool is a
:class:`~prism.core.hosts.ProcessHost`: installed with ``use_process_host``, every supervisor of
the command starts its rank workers on the sandbox agents and its replayers on the assistant
agents. An agent that stops polling for ``lost_after_s`` is a lost node: its processes count as
killed, with a reason that names the node, and the supervisor stops the run. An agent that loses
the head for as long stops its processes and exits. Every call carries the run's token.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from prism.core.errors import PrismError
from prism.core.forkserver import ForkedProcess, ForkServerError, ForkServerPool, fork_server_enabled, preloaded_module
from prism.core.hosts import LocalHost, start_local

from ._pb import agents_pb2 as pb
from ._pb import agents_pb2_grpc as pb_grpc
from .server import TOKEN_METADATA_KEY, _TokenCheck, bind_port, exclusive_server

__all__ = ["AgentPool", "run_agent", "POLL_INTERVAL_S", "AgentLostHeadError"]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
ROLES = ("sandbox", "assistant")
# The head's environment travels with each process; these describe the node, so the agent's own win.
_NODE_VARS = ("SLURM_", "SLURMD_", "CUDA_VISIBLE_DEVICES", "HOSTNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class AgentLostHeadError(PrismError):
    """An agent could not reach the head for too long (the head's node or task is gone)."""


@dataclass(eq=False)
class _Agent:
    role: str
    index: int
    node: str
    pid: int
    task: int
    last_seen: float
    starts: list = field(default_factory=list)
    signals: list = field(default_factory=list)
    running: set = field(default_factory=set)
    lost: str = ""
    saw_stop: bool = False

    def describe(self) -> str:
        return f"{self.role} agent {self.index} (Slurm task {self.task}, pid {self.pid})"


class RemoteProcess:
    """A process started by an agent; quacks like :class:`prism.core.hosts.Process`."""

    def __init__(self, pool: AgentPool, launch: int, agent: _Agent) -> None:
        self._pool = pool
        self._launch = launch
        self.where = agent.node
        self.pid = launch

    @property
    def lost_reason(self) -> str:
        return self._pool._lost_reasons.get(self._launch, "")

    def poll(self) -> int | None:
        return self._pool._exits.get(self._launch)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"launch {self._launch} on {self.where}", timeout)
            time.sleep(POLL_INTERVAL_S / 2)
        return code

    def signal_group(self, signum: int) -> None:
        self._pool._signal(self._launch, signum)


class _Servicer(pb_grpc.AgentsServicer):
    def __init__(self, pool: AgentPool) -> None:
        self._pool = pool

    def Poll(self, request, context):
        return self._pool._on_poll(request)


class AgentPool:
    """The head's side: a gRPC server the agents poll, and a ProcessHost that places processes on them."""

    multi_node = True

    def __init__(self, *, bind: str, token: str, reachable_host: str, lost_after_s: float = 10.0) -> None:
        if not token:
            raise PrismError("agents: a multi-node run needs a token (PRISM_TOKEN)")
        self.reachable_host = reachable_host
        self.lost_after_s = lost_after_s
        self._lock = threading.Lock()
        self._agents: dict[tuple[str, int], _Agent] = {}
        self._where: dict[int, _Agent] = {}
        self._exits: dict[int, int] = {}
        self._lost_reasons: dict[int, str] = {}
        self._launches = itertools.count(1)
        self._local = LocalHost()
        self._stop_reason = ""
        self._closed = threading.Event()
        self._server = exclusive_server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="agents"),
                                        [_TokenCheck(token)])
        pb_grpc.add_AgentsServicer_to_server(_Servicer(self), self._server)
        self.port = bind_port(self._server, bind, "agents (PRISM_PORT sets the head's port)")
        self._server.start()
        self._watch = threading.Thread(target=self._watch_loop, name="agents-watch", daemon=True)
        self._watch.start()
        log.info("agent pool listening on %s (reachable as %s:%d)", bind, reachable_host, self.port)

    # -- the agents' side --------------------------------------------------------------------
    def _on_poll(self, request) -> pb.PollReply:
        now = time.monotonic()
        with self._lock:
            key = (request.role, request.index)
            agent = self._agents.get(key)
            if agent is None:
                agent = self._agents[key] = _Agent(request.role, request.index, request.node, request.pid,
                                                   request.task, now)
                log.info("joined: %s on %s", agent.describe(), agent.node)
            if agent.lost:
                return pb.PollReply(stop=True, stop_reason=f"the head declared this node lost: {agent.lost}")
            agent.last_seen = now
            for e in request.exits:
                self._exits[e.key] = e.code
                agent.running.discard(e.key)
            reply = pb.PollReply(starts=agent.starts, signals=[pb.SignalProcess(key=k, signal=s) for k, s in agent.signals])
            agent.starts, agent.signals = [], []
            if self._stop_reason:
                agent.saw_stop = True
                reply.stop, reply.stop_reason = True, self._stop_reason
            return reply

    def _watch_loop(self) -> None:
        while not self._closed.wait(POLL_INTERVAL_S * 2):
            now = time.monotonic()
            with self._lock:
                for agent in self._agents.values():
                    silent = now - agent.last_seen
                    if agent.lost or agent.saw_stop or silent < self.lost_after_s:
                        continue
                    agent.lost = (f"node {agent.node} lost: its {agent.describe()} has not called the head for "
                                  f"{silent:.1f} s (the task was killed or the node is unreachable)")
                    log.error("%s", agent.lost)
                    for launch in agent.running | {s.key for s in agent.starts}:
                        self._exits.setdefault(launch, -signal.SIGKILL)  # it died with its agent
                        self._lost_reasons[launch] = agent.lost
                    agent.running.clear()
                    agent.starts.clear()

    # -- the head's side ---------------------------------------------------------------------
    def wait_for_agents(self, expected: dict[str, int], timeout_s: float) -> None:
        """Until ``expected[role]`` agents of each role have joined."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                have = {role: sorted(i for (r, i), a in self._agents.items() if r == role and not a.lost)
                        for role in expected}
            if all(len(have[role]) >= n for role, n in expected.items()):
                return
            if time.monotonic() > deadline:
                missing = {role: sorted(set(range(n)) - set(have[role])) for role, n in expected.items()}
                raise PrismError(f"agents: after {timeout_s:.0f} s these agents have not joined the head at "
                                 f"port {self.port}: {missing} (check the job's other tasks and PRISM_COORDINATOR)")
            time.sleep(POLL_INTERVAL_S)

    def agents(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return sorted((a.role, a.index, a.node) for a in self._agents.values())

    def start(self, key: int, argv: Sequence[str], env: dict[str, str], *, log_path: Path, role: str = "sandbox",
              slot: int | None = None, preload: Sequence[str] = ()):
        with self._lock:
            candidates = sorted((a for a in self._agents.values() if a.role == role and not a.lost),
                                key=lambda a: a.index)
            if not candidates:  # e.g. no assistant nodes: the head's node hosts them
                return self._local.start(key, argv, env, log_path=log_path, role=role, slot=slot)
            if slot is not None:
                agent = candidates[slot % len(candidates)]
            else:
                agent = min(candidates, key=lambda a: (len(a.running) + len(a.starts), a.index))
            launch = next(self._launches)
            agent.starts.append(pb.StartProcess(key=launch, argv=list(argv), env=env, log_path=str(log_path),
                                                preload=list(preload)))
            agent.running.add(launch)
            self._where[launch] = agent
            log.info("process %d (launch %d) -> %s on %s", key, launch, agent.describe(), agent.node)
            return RemoteProcess(self, launch, agent)

    def _signal(self, launch: int, signum: int) -> None:
        with self._lock:
            agent = self._where.get(launch)
            if agent is not None and launch not in self._exits:
                agent.signals.append((launch, signum))

    def settle(self) -> None:
        deadline = time.monotonic() + self.lost_after_s + 1.0
        while time.monotonic() < deadline:
            with self._lock:
                now = time.monotonic()
                silent = [a for a in self._agents.values()
                          if not a.lost and a.running and now - a.last_seen > 5 * POLL_INTERVAL_S + 0.5]
            if not silent:
                return
            time.sleep(POLL_INTERVAL_S)

    def close(self, reason: str = "the run is over", grace_s: float = 5.0) -> None:
        """Tell every agent to stop its processes and exit; wait (up to ``grace_s``) until they heard it."""
        with self._lock:
            self._stop_reason = reason
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                if all(a.saw_stop or a.lost for a in self._agents.values()):
                    break
            time.sleep(POLL_INTERVAL_S)
        self._closed.set()
        self._server.stop(0.5).wait()

    def __enter__(self) -> AgentPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _merged_env(theirs: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in theirs.items() if not k.startswith(_NODE_VARS)}
    env.update({k: v for k, v in os.environ.items() if k.startswith(_NODE_VARS)})
    return env


class _NodeLauncher:
    """Starts the head's processes on this node: a preloaded ``python -m`` process forks from a
    fork server of this node (one per preload and environment, ended with the agent; beyond
    ``_MAX_SERVERS`` the least recently used idle ones end, a busy one never: :class:`ForkServerPool`),
    the rest start afresh; so does everything after a server failed."""

    _MAX_SERVERS = 4

    def __init__(self) -> None:
        self._servers = ForkServerPool(self._MAX_SERVERS)
        self._forking = fork_server_enabled()

    def start(self, request: pb.StartProcess) -> subprocess.Popen | ForkedProcess:
        argv, env, log_path = list(request.argv), _merged_env(dict(request.env)), Path(request.log_path)
        module = preloaded_module(argv, request.preload) if self._forking else None
        if module is not None:
            try:
                return self._servers.start(request.preload, env, module, argv[3:], log_path)
            except ForkServerError as e:
                log.warning("%s; starting processes afresh", e)
                self._forking = False
        return start_local(argv, env, log_path)

    def close(self) -> None:
        self._servers.close()


def _stop_all(procs: dict[int, subprocess.Popen | ForkedProcess]) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run_agent(address: str, token: str, *, role: str, index: int, node: str, task: int,
              join_timeout_s: float = 300.0, lost_after_s: float = 10.0) -> str:
    """Serve the head at ``address`` until it says stop; returns its reason. Raises
    :class:`AgentLostHeadError` when the head is unreachable for ``lost_after_s`` (or does not
    answer within ``join_timeout_s`` at first). Every process it started is stopped on the way out."""
    if role not in ROLES:
        raise PrismError(f"agent: role {role!r} is not one of {ROLES}")
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.AgentsStub(channel)
    meta = ((TOKEN_METADATA_KEY, token),)
    procs: dict[int, subprocess.Popen | ForkedProcess] = {}
    launcher = _NodeLauncher()
    exits: list[pb.ProcessExit] = []
    joined = False
    last_ok = time.monotonic()
    try:
        while True:
            request = pb.PollRequest(role=role, index=index, node=node, pid=os.getpid(), task=task, exits=exits)
            try:
                reply = stub.Poll(request, metadata=meta, wait_for_ready=not joined,
                                  timeout=join_timeout_s if not joined else max(1.0, lost_after_s / 2))
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise PrismError(f"agent: the head at {address} refused our token: {e.details()}") from None
                limit = join_timeout_s if not joined else lost_after_s
                if time.monotonic() - last_ok > limit:
                    raise AgentLostHeadError(
                        f"{role} agent {index} on {node}: lost the head at {address} for {limit:.0f} s "
                        f"({e.code().name}); stopped its {len(procs)} process(es)") from None
                time.sleep(POLL_INTERVAL_S * 2)
                continue
            joined, last_ok, exits = True, time.monotonic(), []
            for s in reply.starts:
                procs[s.key] = launcher.start(s)
            for sig in reply.signals:
                p = procs.get(sig.key)
                if p is not None and p.poll() is None:
                    try:
                        os.killpg(p.pid, sig.signal)
                    except ProcessLookupError:
                        pass
            if reply.stop:
                return reply.stop_reason
            for launch, p in list(procs.items()):
                code = p.poll()
                if code is not None:
                    exits.append(pb.ProcessExit(key=launch, code=code))
                    del procs[launch]
            time.sleep(POLL_INTERVAL_S)
    finally:
        _stop_all(procs)
        launcher.close()
        channel.close()
