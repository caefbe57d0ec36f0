"""Processes started through a fork server (prism.core.forkserver) behave as processes started
afresh: the module runs as ``__main__`` with its arguments, in its own session, output in its log,
its title the command it stands for, its environment intact; a failure, a kill and the server's
death are reported as they would be, and nothing is left behind. Supervisors of the main thread
share a server (a command that launches several times imports once); it ends at exit. A pool of
servers ends idle ones to make room, never a busy one."""

import json
import os
import signal
import sys
import textwrap
import time

import psutil
import pytest

from prism.core.errors import RankFailedError
from prism.core.forkserver import ForkServer, ForkServerPool, close_shared_servers
from prism.core.supervise import Supervisor, package_env

MODULE = "prism_fs_probe"
PROBE = textwrap.dedent("""
    import json, os, random, sys, time

    def main():
        print(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
                          "name": __name__, "cwd": os.getcwd(), "random": random.random(),
                          "stdin": sys.stdin.read(), "tag": os.environ.get("PROBE_TAG"),
                          "spt": "SPT_NOENV" in os.environ}), flush=True)
        if "--raise" in sys.argv:
            raise RuntimeError("the probe failed on purpose")
        if "--grandchild" in sys.argv:  # a process of its group, and memory that takes a while to free at exit
            import subprocess
            ballast = b"x" * (256 << 20)
            grandchild = subprocess.Popen(["sleep", "60"])
            with open(sys.argv[sys.argv.index("--grandchild") + 1], "w") as f:
                f.write(str(grandchild.pid))
        if "--sleep" in sys.argv:
            time.sleep(60)
        if "--until" in sys.argv:  # a file appears
            while not os.path.exists(sys.argv[sys.argv.index("--until") + 1]):
                time.sleep(0.02)
        return int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0

    if __name__ == "__main__":
        sys.exit(main())
""")


@pytest.fixture
def probe(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / f"{MODULE}.py").write_text(PROBE)
    env = package_env({"PROBE_TAG": tmp_path.name})
    env["PYTHONPATH"] = f"{tmp_path / 'mod'}{os.pathsep}{env['PYTHONPATH']}"
    monkeypatch.chdir(tmp_path)
    yield tmp_path, env
    close_shared_servers()  # what exit does


def argv(*args: str) -> list[str]:
    return [sys.executable, "-m", MODULE, *args]


def report(sup: Supervisor, rank: int) -> dict:
    return json.loads((sup.log_dir / f"rank-{rank:05d}.log").read_text().splitlines()[0])


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("PROBE_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_forked_processes_run_the_module_as_main_in_their_own_session_with_their_title(probe):
    tmp_path, env = probe
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=(MODULE,)) as sup:
        procs = [sup.start(r, argv("--rank", str(r), "0"), env) for r in range(3)]
        sup.wait_all(timeout_s=60)
        seen = [report(sup, r) for r in range(3)]
        sleeper = sup.start(3, argv("--sleep"), env)
        deadline = time.monotonic() + 30
        while not (sup.log_dir / "rank-00003.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        title = " ".join(psutil.Process(sleeper.pid).cmdline())
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "again", preload=(MODULE,)) as sup:
        sup.start(0, argv("0"), env)
        sup.wait_all(timeout_s=60)
        again = report(sup, 0)
    assert again["ppid"] == seen[0]["ppid"]  # the next launch forks from the same server
    for r, (p, s) in enumerate(zip(procs, seen, strict=True)):
        assert s["name"] == "__main__" and s["argv"] == ["--rank", str(r), "0"]
        assert s["pid"] == p.pid and s["sid"] == p.pid  # a session of its own, as start_new_session gives
        assert s["ppid"] != os.getpid()  # forked by the server, not by us
        assert s["cwd"] == str(tmp_path) and s["stdin"] == "" and s["tag"] == tmp_path.name and not s["spt"]
    assert len({s["random"] for s in seen}) == 3  # each child has its own random state
    assert title.startswith(f"{sys.executable} -m {MODULE} --sleep")  # what ps shows
    assert [p.pid for p in tagged(tmp_path.name)] == [again["ppid"]]  # the sleeper is gone; the server stays
    close_shared_servers()
    assert not tagged(tmp_path.name)


def test_a_failing_forked_process_stops_the_run_with_its_own_traceback(probe):
    tmp_path, env = probe
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=(MODULE,)) as sup:
        sup.start(0, argv("--sleep"), env)
        sup.start(1, argv("--raise"), env)
        with pytest.raises(RankFailedError) as e:
            sup.wait_all(timeout_s=60)
    assert e.value.rank == 1
    text = str(e.value)
    assert "exited with code 1" in text and "RuntimeError: the probe failed on purpose" in text
    assert "forkserver" not in text and "runpy" not in text  # the traceback of `python -m`, less its frames
    assert all("forkserver" in " ".join(p.cmdline()) for p in tagged(tmp_path.name))  # the sleeping rank was stopped


def test_a_killed_child_and_a_killed_server_are_reported_and_leave_nothing(probe):
    tmp_path, env = probe
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=(MODULE,)) as sup:
        p = sup.start(0, argv("--sleep"), env)
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGKILL)
        with pytest.raises(RankFailedError, match=r"killed by signal 9 \(SIGKILL\)"):
            sup.wait_all(timeout_s=60)
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=(MODULE,)) as sup:
        p = sup.start(0, argv("--sleep"), env)
        server = psutil.Process(p.pid).parent()
        assert "prism.core.forkserver" in " ".join(server.cmdline())
        server.kill()
        with pytest.raises(RankFailedError, match="killed by signal 9"):
            sup.wait_all(timeout_s=60)  # its children die with it (PR_SET_PDEATHSIG)
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=(MODULE,)) as sup:
        sup.start(0, argv("0"), env)  # a dead shared server is replaced
        sup.wait_all(timeout_s=60)
        assert report(sup, 0)["ppid"] != server.pid
    close_shared_servers()
    deadline = time.monotonic() + 10
    while tagged(tmp_path.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tagged(tmp_path.name)


@pytest.mark.parametrize("how", ["PRISM_FORK_SERVER=0", "not preloaded"])
def test_without_the_fork_server_processes_start_afresh(probe, monkeypatch, how):
    tmp_path, env = probe
    preload = (MODULE,)
    if how == "PRISM_FORK_SERVER=0":
        monkeypatch.setenv("PRISM_FORK_SERVER", "0")
    else:
        preload = ("some.other.module",)
    with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "logs", preload=preload) as sup:
        sup.start(0, argv("--rank", "0", "3"), env)
        with pytest.raises(RankFailedError, match="exited with code 3"):
            sup.wait_all(timeout_s=60)
        assert report(sup, 0)["ppid"] == os.getpid()


def test_a_supervisor_off_the_main_thread_forks_from_a_server_of_its_own_and_ends_it(probe):
    import threading

    tmp_path, env = probe
    seen = {}

    def launch():
        with Supervisor(error_dir=tmp_path, log_dir=tmp_path / "thread", preload=(MODULE,)) as sup:
            sup.start(0, argv("0"), env)
            sup.wait_all(timeout_s=60)
            seen.update(report(sup, 0))

    t = threading.Thread(target=launch)
    t.start()
    t.join(timeout=60)
    assert seen["ppid"] != os.getpid()  # forked by a server
    assert not tagged(tmp_path.name)  # which ended with its supervisor: no shared server was started


def test_closing_a_server_stops_its_running_child_and_its_group_and_reports_it_killed(probe):
    tmp_path, env = probe
    server = ForkServer((MODULE,), env)
    grandchild_file = tmp_path / "grandchild"
    child = server.start(MODULE, ["--grandchild", str(grandchild_file), "--sleep"], tmp_path / "logs" / "sleeper.log")
    deadline = time.monotonic() + 30
    while not grandchild_file.exists() or not grandchild_file.read_text():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.02)
    grandchild = int(grandchild_file.read_text())
    server.close()
    assert child.wait(timeout=5) == -signal.SIGKILL  # a wait on it ends
    for pid in (child.pid, grandchild):  # gone when close returns, not merely signalled
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_a_full_pool_ends_its_least_recently_used_idle_server_and_never_a_busy_one(probe):
    tmp_path, env = probe
    pool = ForkServerPool(max_servers=2)
    try:
        busy, idle = (pool.get((MODULE,), {**env, "PROBE_ENV": name}) for name in ("busy", "idle"))
        release = tmp_path / "release"
        child = busy.start(MODULE, ["--until", str(release)], tmp_path / "logs" / "busy.log")
        third = pool.get((MODULE,), {**env, "PROBE_ENV": "third"})  # the busy server is the oldest
        assert not idle.alive() and busy.alive() and third.alive()
        assert child.poll() is None
        assert pool.get((MODULE,), {**env, "PROBE_ENV": "busy"}) is busy
        release.touch()
        assert child.wait(timeout=30) == 0

        orphan = third.start(MODULE, ["--sleep"], tmp_path / "logs" / "orphan.log")
        psutil.Process(orphan.pid).parent().kill()
        deadline = time.monotonic() + 10
        while third.alive():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        again = pool.get((MODULE,), {**env, "PROBE_ENV": "third"})  # a dead server is replaced
        assert again is not third and again.alive()
        assert orphan.wait(timeout=5) == -signal.SIGKILL
    finally:
        pool.close()
    assert not busy.alive() and not again.alive()
