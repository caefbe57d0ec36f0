"""Three hosts without Slurm: network namespaces joined by veth pairs on a bridge. The head
(coordinator, TCPStore) runs in one, the sandbox agent (rank workers) in another, the assistant
agent (replayer) in a third; collect and emulate run across them. The namespaces have no route
but their /24, and the root namespace blackholes it, so every byte between the roles travels on
the namespaces' addresses (loopback is per namespace)."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, processes_tagged

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0:
        pytest.skip(f"network namespaces need root (uid {os.geteuid()})")
    if not (shutil.which("ip") and shutil.which("nsenter")):
        pytest.skip("iproute2 (ip) or nsenter is missing")
    suffix = uuid.uuid4().hex[:6]
    net = f"10.{200 + int(suffix[:2], 16) % 50}.{int(suffix[2:4], 16)}"
    names = {"head": f"ph{suffix}", "sandbox": f"ps{suffix}", "assistant": f"pa{suffix}"}
    addrs = {"head": f"{net}.10", "sandbox": f"{net}.11", "assistant": f"{net}.12"}
    had_netns_dir = Path("/run/netns").exists()
    made, blackhole = [], False
    try:
        _ip("route", "add", "blackhole", f"{net}.0/24")  # nothing in the root namespace reaches them
        blackhole = True
        bridge = f"br{suffix}"
        _ip("netns", "add", names["head"])
        made.append(names["head"])
        _ip("-n", names["head"], "link", "set", "lo", "up")
        _ip("-n", names["head"], "link", "add", bridge, "type", "bridge")
        _ip("-n", names["head"], "addr", "add", f"{addrs['head']}/24", "dev", bridge)
        _ip("-n", names["head"], "link", "set", bridge, "up")
        for i, role in enumerate(("sandbox", "assistant")):
            ns, veth = names[role], f"v{suffix}{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "netns", names["head"])
            _ip("-n", names["head"], "link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addrs[role]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        for ns in made:
            _ip("netns", "del", ns, check=False)
        if blackhole:
            _ip("route", "del", "blackhole", f"{net}.0/24", check=False)
        pytest.skip(f"could not build the network namespaces: {getattr(e, 'stderr', '') or e}")
    try:
        yield names, addrs
    finally:
        for ns in made:
            _ip("netns", "del", ns, check=False)
        _ip("route", "del", "blackhole", f"{net}.0/24", check=False)
        if not had_netns_dir:
            subprocess.run(["umount", "/run/netns"], capture_output=True, timeout=30)
            with __import__("contextlib").suppress(OSError):
                Path("/run/netns").rmdir()


def _eth0_bytes(ns: str) -> int:
    stats = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", "eth0").stdout)[0]["stats64"]
    return stats["rx"]["bytes"] + stats["tx"]["bytes"]


def _run_across(names, addrs, tmp_path, tag, command: list[str]) -> dict[str, subprocess.CompletedProcess]:
    port = 20000 + secrets.randbelow(20000)
    coordinator = f"{addrs['head']}:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRISM_TOKEN": secrets.token_urlsafe(16), "PRISM_TEST_TAG": tag,
           "PRISM_JOIN_TIMEOUT_S": "120", "COLUMNS": "300"}
    prism = [sys.executable, "-m", "prism.cli.main", "-v", "node", "--coordinator", coordinator]
    argv = {"head": [*prism, "--role", "head", "--name", "head", "--sandbox-agents", "1", "--assistant-agents", "1",
                     *command],
            "sandbox": [*prism, "--role", "sandbox", "--name", "sandbox"],
            "assistant": [*prism, "--role", "assistant", "--name", "assistant"]}
    procs = {}
    for role in ("head", "sandbox", "assistant"):
        role_env = env if role == "head" else {**env, "GLOO_SOCKET_IFNAME": "eth0"}
        procs[role] = subprocess.Popen(["nsenter", f"--net=/run/netns/{names[role]}", *argv[role]], env=role_env,
                                       cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = {}
    try:
        for role, p in procs.items():
            out, _ = p.communicate(timeout=200)
            done[role] = subprocess.CompletedProcess(p.args, p.returncode, out, "")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def test_collect_and_emulate_across_three_namespace_hosts(hosts, tmp_path):
    names, addrs = hosts
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "ddp2", "entrypoint": str(EXAMPLES / "ddp" / "train.py"), "args": ["--steps", "3"],
        "world_size": 2, "ranks_per_node": 2, "device": "cpu", "slots": 2, "values": {"ranks": "0"},
        "iterations": {"warmup": 1, "measured": 2}, "parallelism": {"dp": 2, "tp": 1, "pp": 1, "ep": 1, "cp": 1}}))
    run = tmp_path / "run"
    tag = uuid.uuid4().hex
    before = {role: _eth0_bytes(names[role]) for role in ("sandbox", "assistant")}
    collect = _run_across(names, addrs, tmp_path, tag, ["collect", "--job", str(job), "--out", str(run)])
    assert {r: c.returncode for r, c in collect.items()} == {"head": 0, "sandbox": 0, "assistant": 0}, \
        "\n".join(c.stdout for c in collect.values())
    assert "joined: sandbox agent 0" in collect["head"].stdout and "on sandbox" in collect["head"].stdout
    assert (run / "graph" / "bare").is_dir()
    after_collect = _eth0_bytes(names["sandbox"])
    emulate = _run_across(names, addrs, tmp_path, tag, ["emulate", str(run), "--ranks", "0", "--asap", "--json"])
    assert {r: c.returncode for r, c in emulate.items()} == {"head": 0, "sandbox": 0, "assistant": 0}, \
        "\n".join(c.stdout for c in emulate.values())
    (report,) = run.rglob("emulations/**/report.json")
    row = json.loads(report.read_text())["ranks"]["0"]
    assert row["diverged_ops"] == [] and len(row["losses"]) == 3 and row["oom"] is False
    # the rank worker talked to the coordinator, then to the replayer and the store, over eth0
    assert after_collect - before["sandbox"] > 50_000
    assert _eth0_bytes(names["assistant"]) - before["assistant"] > 10_000
    assert [p for p in processes_tagged(tag) if p.status() != "zombie"] == []
