"""The run's token on both gRPC services, loopback binding, and the agent pool with real agents
(threads here, Slurm tasks in tests/slurm) starting real processes."""

import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest

from prism.coordinator.cuda_checkpoint import NullSwitcher
from prism.coordinator.payloads import PayloadPolicy, PayloadStore
from prism.coordinator.state import RunState
from prism.core.errors import PrismError, RankFailedError
from prism.core.hosts import use_process_host
from prism.core.supervise import Supervisor, package_env
from prism.rpc import CoordinatorClient, CoordinatorServer
from prism.rpc.agents import AgentPool, run_agent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def coordinator(tmp_path):
    state = RunState(2, 1, switcher=NullSwitcher(), payloads=PayloadStore(tmp_path / "payloads"),
                     policy=PayloadPolicy(True, 64, frozenset()))
    server = CoordinatorServer(state, token="s3cret")
    yield server
    state.stop("test over")
    server.stop()


@pytest.mark.parametrize("token", ["", "wrong"])
def test_the_coordinator_refuses_a_call_without_the_runs_token(coordinator, token):
    client = CoordinatorClient(coordinator.address, token=token)
    with pytest.raises(grpc.RpcError) as err:
        client.register(0, 123)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client.close()


def test_the_coordinator_accepts_the_token_and_listens_on_loopback_only(coordinator):
    client = CoordinatorClient(coordinator.address, token="s3cret")
    assert client.register(0, 123) == 2
    client.close()
    assert coordinator.address.startswith("127.0.0.1:")
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == coordinator.port]
    assert listening and all(_loopback(addr.ip) for addr in listening), listening


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)


@pytest.fixture
def pool():
    p = AgentPool(bind="127.0.0.1:0", token="t0k", reachable_host="127.0.0.1", lost_after_s=1.5)
    yield p
    p.close("test over", grace_s=2)


def start_agent(pool, role, index, results, token="t0k"):
    def main():
        try:
            results[(role, index)] = run_agent(f"127.0.0.1:{pool.port}", token, role=role, index=index, node=f"n{index}",
                                               task=index, join_timeout_s=10, lost_after_s=5)
        except PrismError as e:
            results[(role, index)] = e

    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t


def test_an_agent_with_the_wrong_token_is_refused(pool):
    results = {}
    start_agent(pool, "sandbox", 0, results, token="nope").join(20)
    assert isinstance(results[("sandbox", 0)], PrismError)
    assert "refused our token" in str(results[("sandbox", 0)])
    assert pool.agents() == []


def test_a_second_head_on_the_port_of_a_running_one_is_refused_naming_the_port(pool):
    # gRPC's default SO_REUSEPORT would let it bind, and take half of the agents' connections
    with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{pool.port}: the port is in use"):
        AgentPool(bind=f"127.0.0.1:{pool.port}", token="other", reachable_host="127.0.0.1")
    results = {}
    start_agent(pool, "sandbox", 0, results)
    deadline = time.monotonic() + 10
    while not pool.agents():  # the first head still serves its agents
        assert time.monotonic() < deadline and not results, results
        time.sleep(0.05)


def test_processes_run_on_the_agents_and_their_exit_codes_come_back(pool, tmp_path):
    results = {}
    threads = [start_agent(pool, "sandbox", i, results) for i in (0, 1)] + [start_agent(pool, "assistant", 0, results)]
    pool.wait_for_agents({"sandbox": 2, "assistant": 1}, timeout_s=20)
    with use_process_host(pool), Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs") as sup:
        p0 = sup.start(0, [sys.executable, "-c", "print('zero')"], {}, slot=1)
        p1 = sup.start(5, [sys.executable, "-c", "print('replayer')"], {}, role="assistant", name="replayer 0")
        sup.wait_all(timeout_s=30)
        assert (p0.where, p1.where) == ("n1", "n0")
        assert (tmp_path / "logs" / "rank-00000.log").read_text() == "zero\n"
        failing = sup.start(1, [sys.executable, "-c", "import sys; print('boom'); sys.exit(4)"], {})
        with pytest.raises(RankFailedError) as err:
            sup.wait_all(timeout_s=30)
        assert err.value.exit_code == 4 and err.value.part == f"rank 1 on {failing.where}"
        assert "boom" in err.value.traceback_text
        # kill_all reaches a process on an agent
        sleeper = sup.start(2, [sys.executable, "-c", "import time; time.sleep(60)"], {})
        deadline = time.monotonic() + 20
        while not [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(60)" in " ".join(p.info["cmdline"] or [])]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        sup.kill_all()
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
    pool.close("done")
    for t in threads:
        t.join(10)
    assert results == {("sandbox", 0): "done", ("sandbox", 1): "done", ("assistant", 0): "done"}


AGENT = """
import sys
from prism.rpc.agents import run_agent
run_agent(sys.argv[1], "t0k", role="sandbox", index=0, node="n0", task=0, join_timeout_s=10, lost_after_s=5)
"""


def test_a_killed_agent_is_a_lost_node_named_in_the_failure_and_its_processes_die_with_it(pool, tmp_path):
    agent = subprocess.Popen([sys.executable, "-c", AGENT, f"127.0.0.1:{pool.port}"])
    try:
        pool.wait_for_agents({"sandbox": 1}, timeout_s=30)
        with use_process_host(pool), Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs") as sup:
            sup.start(0, [sys.executable, "-c", "import time; time.sleep(60)"], {})
            deadline = time.monotonic() + 20
            while not (children := psutil.Process(agent.pid).children()):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            os.kill(agent.pid, signal.SIGKILL)
            with pytest.raises(RankFailedError) as err:
                sup.wait_all(timeout_s=30)
        assert "node n0 lost" in str(err.value) and err.value.part == "rank 0 on n0"
        assert "has not called the head for" in err.value.traceback_text
        _, alive = psutil.wait_procs(children, timeout=5)
        assert alive == []  # the agent's processes die with it (PR_SET_PDEATHSIG)
    finally:
        agent.kill()
        agent.wait()


PROBE = """
import os, sys, time
if __name__ == "__main__":  # a fork server imports the module once before it runs it
    print(os.getpid(), os.getppid(), flush=True)
    if sys.argv[1:] == ["fail"]:
        raise RuntimeError("the probe failed on purpose")
    if sys.argv[1:]:
        time.sleep(float(sys.argv[1]))
"""
PROBE_ARGV = [sys.executable, "-m", "prism_agent_probe"]


@pytest.fixture
def probe_agent(pool, tmp_path):
    """A sandbox agent in a process of its own, whose environment imports PROBE as
    ``prism_agent_probe``: (the agent, that environment)."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "prism_agent_probe.py").write_text(PROBE)
    env = package_env({"PYTHONPATH": str(tmp_path / "mod")})
    agent = subprocess.Popen([sys.executable, "-c", AGENT, f"127.0.0.1:{pool.port}"], env=env)
    try:
        pool.wait_for_agents({"sandbox": 1}, timeout_s=30)
        yield agent, env
    finally:
        agent.kill()
        agent.wait()


def probe_supervisor(tmp_path) -> Supervisor:
    return Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=("prism_agent_probe",))


def test_an_agent_forks_preloaded_modules_from_a_server_of_its_node_that_ends_with_it(pool, probe_agent, tmp_path):
    agent, env = probe_agent
    with use_process_host(pool), probe_supervisor(tmp_path) as sup:
        sup.start(0, PROBE_ARGV, env)
        sup.start(1, PROBE_ARGV, env)
        sup.wait_all(timeout_s=30)
        (pid0, ppid0), (pid1, ppid1) = (
            map(int, (tmp_path / "logs" / f"rank-0000{r}.log").read_text().split()) for r in (0, 1))
        server = psutil.Process(ppid0)
        assert ppid1 == ppid0 and server.parent().pid == agent.pid  # one server of the agent's node
        assert "prism.core.forkserver" in " ".join(server.cmdline())
        sup.start(2, [*PROBE_ARGV, "fail"], env)
        with pytest.raises(RankFailedError) as err:
            sup.wait_all(timeout_s=30)
        assert err.value.exit_code == 1 and "the probe failed on purpose" in err.value.traceback_text
    pool.close("done")
    assert agent.wait(timeout=20) == 0
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


def test_an_agent_keeps_at_most_four_fork_servers_and_ends_only_idle_ones(pool, probe_agent, tmp_path):
    agent, env = probe_agent
    with use_process_host(pool), probe_supervisor(tmp_path) as sup:
        sleeper = sup.start(0, [*PROBE_ARGV, "60"], {**env, "PROBE_ENV": "busy"})
        for i in range(1, 6):  # a server per environment; each launch ends before the next
            sup.start(i, PROBE_ARGV, {**env, "PROBE_ENV": str(i)})
            deadline = time.monotonic() + 30
            while sup.procs[i].poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        servers = [p for p in psutil.Process(agent.pid).children()
                   if "prism.core.forkserver" in " ".join(p.cmdline())]
        assert len(servers) <= 4
        assert sleeper.poll() is None  # its server was busy: kept
        sup.kill_all()
    pool.close("done")
    assert agent.wait(timeout=20) == 0
