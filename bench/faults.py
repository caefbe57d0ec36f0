"""Fault injection: how each command stops when a part of the run fails, measured.

    python bench/faults.py [--out bench/results/faults.json] [--only NAME ...]

For every case the real ``prism`` CLI runs the job of tests/assets/jobs/faults4 (4 ranks, a
100 ms sleep and an all-reduce per step, "step N" printed after each step) in a subprocess whose
environment carries a tag, so every process of the run can be found with psutil. The fault is
injected mid-run (after some rank printed "step 2"), or the run directory is damaged beforehand.
Measured per case:

* ``stop_s``: seconds from the fault to the CLI's exit (for a fault that kills the CLI itself:
  to the moment no process of the run is left; for a file damaged before the launch: launch to
  exit, ``wall_s``, minus the CLI's own startup, ``cli_startup_s``: the imports every command
  pays, which on a loaded 2-core host alone take several seconds);
* ``message``: the CLI's error lines, and whether they name the part (``names_part``) and the
  cause (``names_cause``);
* ``left_processes``: processes of the run still alive 2 s after the CLI exited;
* ``half_written``: anything partial under RUN/graph/* or RUN/payloads (a graph directory that
  does not read back, payloads without their index, a temporary file), and ``stale_temps``:
  hidden temporary directories left by a killed writer (never read; removed by the next run).

A case passes when it stops within 10 s, names the part and the cause, and leaves no process and
nothing half-written.

The disk-full case mounts a small tmpfs (needs root, or a user+mount namespace); otherwise it caps
the file size with RLIMIT_FSIZE, and says which in ``disk``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prism.graph.io import read_graph  # noqa: E402

JOB_DIR = ROOT / "tests/assets/jobs/faults4"
RESULTS = ROOT / "bench/results"
STOP_BOUND_S = 10.0
TAG_VAR = "PRISM_FAULT_TAG"


@dataclass
class Outcome:
    name: str
    command: str
    fault: str
    exit_code: int | None = None
    stop_s: float | None = None
    wall_s: float | None = None
    """Damaged-file cases: launch to exit; ``stop_s`` is this minus ``cli_startup_s``."""
    cli_startup_s: float | None = None
    """Damaged-file cases: launch to exit of ``prism emulate --help`` just before (the imports)."""
    workers_started: bool | None = None
    """Damaged-file cases: whether any process besides the CLI started before it stopped."""
    message: str = ""
    names_part: bool | None = None
    names_cause: bool | None = None
    left_processes: list[str] = field(default_factory=list)
    half_written: list[str] = field(default_factory=list)
    stale_temps: list[str] = field(default_factory=list)
    note: str = ""
    passed: bool = False


# --- processes -------------------------------------------------------------------------------

def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(TAG_VAR) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[-120:]}"
    except psutil.Error:
        return str(p.pid)


def find(tag: str, needle: str) -> psutil.Process | None:
    for p in tagged(tag):
        with contextlib.suppress(psutil.Error):
            if needle in " ".join(p.cmdline()):
                return p
    return None


def wait_for(pred, timeout_s: float, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    return None


def log_says(pattern: str, text: str):
    def check() -> bool:
        for path in Path("/").glob(pattern.lstrip("/")):
            with contextlib.suppress(OSError):
                if text in path.read_text(errors="replace"):
                    return True
        return False
    return check


# --- run directories -------------------------------------------------------------------------

def inspect_run(run: Path) -> tuple[list[str], list[str]]:
    """(half-written things, stale temporaries) under RUN/graph and RUN/payloads."""
    partial, stale = [], []
    graphs = run / "graph"
    if graphs.is_dir():
        for d in sorted(graphs.iterdir()):
            if d.name.startswith("."):
                stale.append(str(d.relative_to(run)))
                continue
            try:
                read_graph(d)
            except Exception as e:  # noqa: BLE001 - any failure to read back is what we report
                partial.append(f"{d.relative_to(run)}: {type(e).__name__}: {str(e)[:120]}")
    payloads = run / "payloads"
    if payloads.is_dir():
        if not (payloads / "index.json").is_file() and any(payloads.glob("*.safetensors")):
            partial.append("payloads: files without index.json")
        for tmp in payloads.rglob("*.tmp"):
            partial.append(str(tmp.relative_to(run)))
        pruned = payloads / "pruned"
        if pruned.is_dir():
            for d in pruned.iterdir():
                if d.is_dir() and not (d / "index.json").is_file():
                    partial.append(f"{d.relative_to(run)}: no index.json")
    for d in list(run.glob(".*.tmp")) + list((run / "payloads").glob(".*.tmp") if payloads.is_dir() else []):
        stale.append(str(d.relative_to(run)))
    return partial, stale


# --- the CLI ---------------------------------------------------------------------------------

class Cli:
    def __init__(self, work: Path, name: str, args: list[str], *, env: dict | None = None, preexec=None,
                 cwd: Path | None = None) -> None:
        self.tag = uuid.uuid4().hex
        self.err_path = work / f"{name}.stderr"
        self.out_path = work / f"{name}.stdout"
        full_env = dict(os.environ, **{TAG_VAR: self.tag}, **(env or {}))
        full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
        full_env["COLUMNS"] = "200"

        def setup() -> None:
            # As in a terminal's foreground: a shell starts background jobs with SIGINT ignored,
            # and Python then installs no KeyboardInterrupt handler.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if preexec:
                preexec()

        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "prism.cli.main", *args], env=full_env,
                                         stdout=out, stderr=err, cwd=cwd or work, preexec_fn=setup)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for p in tagged(self.tag):
            with contextlib.suppress(psutil.Error):
                p.kill()


def error_lines(text: str, limit: int = 6) -> str:
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith(("error:", "interrupted", "prism: ")):
            return "\n".join(lines[i:i + limit])[:600]
    return "\n".join(lines[-limit:])[:600]


def finish(o: Outcome, cli: Cli, run: Path | None, t_fault: float, *, part: str, cause: str,
           cli_killed: bool = False, timeout_s: float = 90.0) -> Outcome:
    """Wait for the CLI's exit, then measure what was left behind."""
    code = cli.wait(timeout_s)
    t_exit = time.monotonic()
    if code is None:
        o.note = (o.note + f"; no exit within {timeout_s:.0f} s (killed)").lstrip("; ")
        cli.kill()
    o.exit_code = code
    if cli_killed:  # the CLI is gone at once: the run stops when its last process is gone
        wait_for(lambda: not tagged(cli.tag), 30)
        t_exit = time.monotonic()
    o.stop_s = round(t_exit - t_fault, 2)
    time.sleep(2.0)
    o.left_processes = [describe(p) for p in tagged(cli.tag)]
    for p in tagged(cli.tag):
        with contextlib.suppress(psutil.Error):
            p.kill()
    text = cli.stderr()
    o.message = error_lines(text)
    if cli_killed:
        o.note = (o.note + "; the killed process is the CLI itself: nothing can print, the workers die with it "
                  "(PR_SET_PDEATHSIG)").lstrip("; ")
    else:
        o.names_part = bool(re.search(part, text))
        o.names_cause = bool(re.search(cause, text))
    if run is not None:
        o.half_written, o.stale_temps = inspect_run(run)
    o.passed = judge(o)
    return o


def judge(o: Outcome) -> bool:
    """Stopped within the bound, named the part and the cause (where the CLI lives to say it),
    left no process and nothing half-written; a damaged file must not pass unnoticed."""
    cli_killed = o.exit_code == -signal.SIGKILL
    named = cli_killed or bool(o.names_part and o.names_cause)
    in_time = o.stop_s is not None and (o.stop_s <= STOP_BOUND_S or o.workers_started is False)
    stopped = in_time and o.exit_code not in (None, 0)
    return stopped and named and not o.left_processes and not o.half_written


# --- jobs ------------------------------------------------------------------------------------

def write_job(work: Path, name: str, *, steps: int, numel: int = 1024, values_ranks: str = "0-1",
              extra: dict | None = None) -> Path:
    data = {"name": f"faults-{name}", "entrypoint": str(JOB_DIR / "train.py"),
            "args": ["--steps", str(steps), "--numel", str(numel)], "world_size": 4, "slots": 2,
            "iterations": {"warmup": 1, "measured": 3}, "values": {"ranks": values_ranks}, **(extra or {})}
    path = work / f"job-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def collect_base(work: Path, name: str, job: Path) -> Path:
    run = work / name
    cli = Cli(work, f"base-{name}", ["collect", "--job", str(job), "--out", str(run), "--timeout", "300"])
    if cli.wait(400) != 0:
        raise SystemExit(f"collect of the base run {name} failed:\n{cli.stderr()[-3000:]}")
    return run


# --- the cases -------------------------------------------------------------------------------

def mid_run(work: Path, name: str, command: str, fault: str, args: list[str], log_glob: str, inject,
            *, part: str, cause: str, run: Path | None, cli_killed: bool = False, env: dict | None = None,
            preexec=None) -> Outcome:
    o = Outcome(name, command, fault)
    cli = Cli(work, name, args, env=env, preexec=preexec)
    if not wait_for(log_says(log_glob, "step 2"), 180, 0.1):
        cli.kill()
        o.note = f"the run never reached step 2 ({log_glob}):\n" + error_lines(cli.stderr())
        return o
    note = inject(cli)
    t_fault = time.monotonic()
    if note:
        o.note = note
    return finish(o, cli, run, t_fault, part=part, cause=cause, cli_killed=cli_killed)


def kill_target(needle: str, sig: int):
    def inject(cli: Cli) -> str:
        p = find(cli.tag, needle)
        if p is None:
            return f"no process matching {needle!r}"
        p.send_signal(sig)
        return ""
    return inject


def signal_cli(sig: int):
    def inject(cli: Cli) -> str:
        cli.proc.send_signal(sig)
        return ""
    return inject


def damage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "corrupt":  # flip one byte in the second half (a tensor's data in a safetensors file)
        data = bytearray(path.read_bytes())
        i = len(data) * 3 // 4
        data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        raise AssertionError(how)


def cli_startup_s(work: Path) -> float:
    """Seconds from launch to exit of ``prism emulate --help``: the imports every command pays
    (a damaged file can be noticed no sooner), measured right before each case, as the host's
    load changes."""
    t0 = time.monotonic()
    Cli(work, f"startup-{uuid.uuid4().hex[:6]}", ["emulate", "--help"]).wait(120)
    return round(time.monotonic() - t0, 2)


def damaged_run(work: Path, name: str, base: Path, target: str, how: str) -> Outcome:
    """Copy the base run, damage one file, emulate (or collect from it) and measure."""
    run = work / name
    shutil.copytree(base, run, ignore=shutil.ignore_patterns("emulations"))
    if target == "graph rank file":
        path = run / "graph/bare/rank-00002.pb"
    elif target == "manifest":
        path = run / "graph/bare/manifest.pb"
    elif target == "pruned record":
        path = sorted((run / "payloads/pruned/ranks-0_1/c").rglob("*.safetensors"))[1]
    else:  # a content-addressed payload, read by collect with comm_inputs: recorded
        index = json.loads((run / "payloads/index.json").read_text())
        digest = index[sorted(index)[0]]["outputs"]
        path = run / "payloads" / f"{digest}.safetensors"
    damage(path, how)
    startup = cli_startup_s(work)
    rel = str(path.relative_to(run))
    o = Outcome(name, "collect --comm-inputs recorded" if target == "payload" else "emulate",
                f"{how} {target} ({rel})")
    t0 = time.monotonic()
    if target == "payload":
        job = write_job(work, name, steps=3, extra={"comm_inputs": {"source": "recorded", "run": str(run)}})
        out = work / f"{name}-out"
        cli = Cli(work, name, ["collect", "--job", str(job), "--out", str(out), "--timeout", "60"])
    else:
        cli = Cli(work, name, ["emulate", str(run), "--ranks", "0,1", "--timeout", "60"])
    # the fault is there from the start: stop_s counts from the launch
    part = re.escape(path.name) + "|" + re.escape(rel)
    cause = {"missing": r"missing|not found|No such file|does not exist",
             "truncated": r"truncat|incomplete|corrupt|checksum|sha256|too short|invalid|Error while deserializing",
             "corrupt": r"corrupt|checksum|sha256|hash|invalid|mismatch|Error while deserializing"}[how]

    def child_started() -> bool:
        return any(p.pid != cli.proc.pid for p in tagged(cli.tag))

    started = wait_for(lambda: "child" if child_started() else ("exit" if cli.proc.poll() is not None else None), 120)
    o.workers_started = started != "exit"
    o = finish(o, cli, None, t0, part=part, cause=cause)
    if o.stop_s is not None:
        o.wall_s = o.stop_s
        o.cli_startup_s = startup
        o.stop_s = round(max(0.0, o.wall_s - startup), 2)
    o.half_written, o.stale_temps = inspect_run(work / f"{name}-out") if target == "payload" else ([], [])
    if o.exit_code == 0:
        o.note = (o.note + "; exit 0: the damage went unnoticed").lstrip("; ")
    o.passed = judge(o)
    return o


@contextlib.contextmanager
def small_disk(work: Path, size: str):
    """A size-capped directory: a tmpfs if this process may mount one, else None."""
    mnt = work / "small-disk"
    mnt.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                        capture_output=True).returncode == 0
    try:
        yield mnt if ok else None
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def disk_full(work: Path) -> Outcome:
    job = write_job(work, "diskfull", steps=40, numel=16384)  # 64 KiB per all-reduce: ~5 MiB of payloads
    with small_disk(work, "1m") as mnt:
        if mnt is not None:
            run, preexec, disk = mnt / "run", None, "tmpfs of 1 MiB"
        else:
            import resource

            def preexec():
                resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
            run, disk = work / "diskfull-run", "RLIMIT_FSIZE 256 KiB per file (no tmpfs)"
        o = Outcome("collect_disk_full", "collect", "")
        cli = Cli(work, o.name, ["collect", "--job", str(job), "--out", str(run), "--timeout", "120"],
                  preexec=preexec)
        if mnt is not None:  # the fault: the moment the tmpfs has no room for another payload
            wait_for(lambda: shutil.disk_usage(mnt).free < 80 * 1024 or cli.proc.poll() is not None, 300)
            o.note = "stop_s counts from the moment the tmpfs had < 80 KiB free (one payload is 64 KiB)"
        else:
            o.note = "stop_s counts from the launch"
        t0 = time.monotonic()
        o = finish(o, cli, run, t0, part=re.escape(str(run)) + r"/\S*payloads",
                   cause=r"No space left|File too large")
        o.fault = f"disk fills during collect ({disk})"
    return o


def cases(work: Path, only: set[str]) -> list[Outcome]:
    want = (lambda n: not only or n in only)
    results: list[Outcome] = []
    long_job = write_job(work, "long", steps=40)
    base = None

    def emu_base() -> Path:
        nonlocal base
        if base is None:
            base = collect_base(work, "base", long_job)
        return base

    def emu_args() -> list[str]:
        shutil.rmtree(emu_base() / "emulations", ignore_errors=True)  # the trigger reads the new run's log
        return ["emulate", str(emu_base()), "--ranks", "0,1", "--timeout", "120"]

    def emu_logs() -> str:
        return str(emu_base() / "emulations/*/logs/rank-00000.log")

    def fresh(name: str) -> Path:
        return work / f"{name}-run"

    plan = [
        ("emulate_kill9_sandbox_rank", "emulate", "kill -9 of sandbox rank 1",
         lambda n: mid_run(work, n, "emulate", "kill -9 of sandbox rank 1", emu_args(), emu_logs(),
                           kill_target("spec-00001.json", signal.SIGKILL), part=r"rank 1\b",
                           cause=r"signal 9|SIGKILL|killed", run=emu_base())),
        ("emulate_kill9_replayer", "emulate", "kill -9 of replayer 0",
         lambda n: mid_run(work, n, "emulate", "kill -9 of replayer 0", emu_args(), emu_logs(),
                           kill_target("replayer-000.spec.json", signal.SIGKILL), part=r"replayer 0|replayer",
                           cause=r"signal 9|SIGKILL|killed", run=emu_base())),
        ("collect_kill9_coordinator", "collect", "kill -9 of the coordinator (the CLI process)",
         lambda n: mid_run(work, n, "collect", "kill -9 of the coordinator",
                           ["collect", "--job", str(long_job), "--out", str(fresh(n))],
                           str(fresh(n) / "logs/rank-0000*.log"), signal_cli(signal.SIGKILL),
                           part="", cause="", run=fresh(n), cli_killed=True)),
        *[(f"{cmd}_sigint", cmd, "SIGINT of the CLI",
           (lambda cmd: lambda n: mid_run(
               work, n, cmd, "SIGINT of the CLI",
               emu_args() if cmd == "emulate" else [cmd, "--job", str(long_job), "--out", str(fresh(n))],
               emu_logs() if cmd == "emulate" else str(fresh(n) / "logs/rank-0000*.log"),
               signal_cli(signal.SIGINT), part=rf"{cmd}", cause=r"interrupt|SIGINT",
               run=emu_base() if cmd == "emulate" else fresh(n)))(cmd))
          for cmd in ("collect", "emulate", "record")],
        *[(f"{cmd}_rank_raises", cmd, "rank 2 raises at step 3",
           (lambda cmd: lambda n: mid_run(
               work, n, cmd, "rank 1 raises at step 3",
               emu_args() if cmd == "emulate" else [cmd, "--job", str(long_job), "--out", str(fresh(n))],
               emu_logs() if cmd == "emulate" else str(fresh(n) / "logs/rank-0000*.log"),
               lambda cli: "", part=r"rank 1\b", cause=r"injected failure in rank 1 at step 3",
               run=emu_base() if cmd == "emulate" else fresh(n), env={"FAULT_RAISE": "1:3"}))(cmd))
          for cmd in ("collect", "emulate", "record")],
    ]
    for name, _cmd, _fault, fn in plan:
        if want(name):
            print(f"== {name}", flush=True)
            results.append(fn(name))
            print(json.dumps(asdict(results[-1]), indent=1), flush=True)
    if want("collect_disk_full"):
        print("== collect_disk_full", flush=True)
        results.append(disk_full(work))
        print(json.dumps(asdict(results[-1]), indent=1), flush=True)
    short = None
    for target in ("graph rank file", "manifest", "payload", "pruned record"):
        for how in ("corrupt", "truncated", "missing"):
            name = f"{how}_{target.replace(' ', '_')}"
            if not want(name):
                continue
            if short is None:
                short = collect_base(work, "short", write_job(work, "short", steps=3))
            print(f"== {name}", flush=True)
            results.append(damaged_run(work, name, short, target, how))
            print(json.dumps(asdict(results[-1]), indent=1), flush=True)
    return results


def render_table(data: dict) -> str:
    """The markdown table of docs/faults.md from a faults.json."""
    def yes(x) -> str:
        return "—" if x is None else ("yes" if x else "**no**")

    rows = ["| case | command | fault | stop s | exit | names part / cause | processes left | "
            "half-written | message (first line) |", "|---|---|---|---:|---:|---|---|---|---|"]
    for c in data["cases"]:
        first = (c["message"].splitlines() or [""])[0].replace("|", "\\|")
        first = first if len(first) <= 110 else first[:107] + "..."
        left = str(len(c["left_processes"])) if c["left_processes"] else "none"
        half = ", ".join(c["half_written"]) or "none"
        if c["stale_temps"]:
            half += f" (stale temp: {', '.join(c['stale_temps'])})"
        stop = str(c["stop_s"])
        if c.get("wall_s") is not None:
            stop += f" ({c['wall_s']} − {c['cli_startup_s']} startup" + \
                (", no process started)" if c.get("workers_started") is False else ")")
        rows.append(f"| {c['name']} | {c['command']} | {c['fault']} | {stop} | {c['exit_code']} | "
                    f"{yes(c['names_part'])} / {yes(c['names_cause'])} | {left} | {half} | "
                    + (f"`{first}` |" if first else "(nothing: the CLI was killed) |"))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(RESULTS / "faults.json"))
    parser.add_argument("--only", nargs="*", default=[], help="case names to run (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--table", metavar="JSON", help="print the markdown table of a faults.json and exit")
    args = parser.parse_args()
    if args.table:
        print(render_table(json.loads(Path(args.table).read_text())))
        return 0
    work = Path(tempfile.mkdtemp(prefix="prism-faults-"))
    started = time.monotonic()
    try:
        results = cases(work, set(args.only))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    data = {"stop_bound_s": STOP_BOUND_S, "host_cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
            "wall_s": round(time.monotonic() - started, 1),
            "cases": [asdict(o) for o in results]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    failed = [o.name for o in results if not o.passed]
    print(f"{len(results) - len(failed)} of {len(results)} cases pass; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
