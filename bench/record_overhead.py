"""The recorder's own cost: ms/step of each example under ``prism record`` vs a plain launch.

Per example (W=4 unless ``--world``, small sizes that fit the 2-core host), the job runs alternately

* plain: W processes started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/
  PORT, OMP_NUM_THREADS=1), the script's own ``init_process_group`` (gloo), no prism;
* record: ``prism record --job JOB --out RUN`` (a subprocess): the shim, the recorder and the
  ``passthrough`` engine over real gloo groups. On CPU it runs the job twice (a memory pass with the
  tracker, then the timed pass without it: docs/timing.md); the probe names its files by pass and
  only the timed pass's steps are counted (a baseline tree without passes: its one tracked run).

Both sides carry the same step probe (bench/_step_probe/sitecustomize.py: an optimizer step post
hook noting the wall clock and the process's CPU time, all threads). The CPU time per step is the
figure to trust on a shared, oversubscribed host: the wall time there mostly measures the load. ``--baseline-tree DIR`` adds a third, alternated side: ``prism record`` of the prism
  checked out in DIR (e.g. ``git worktree``/``git archive`` of the commit before a change), so a
  before/after pair is measured under the same host load.

A step is the time between two consecutive ``optimizer.step`` ends on a rank. Per run: the median
over all ranks and the measured steps (the first ``--warmup`` steps and the last one, when ranks
start leaving, are dropped); per side: the median of ``--repeats`` runs. The overhead is
record / plain − 1, for wall and for CPU time.

    python bench/record_overhead.py                       # every example, 3 alternated repeats
    python bench/record_overhead.py --examples moe ddp --repeats 5
    python bench/record_overhead.py --examples tp ddp --world 2 --steps 40   # less oversubscribed on 2 cores
    python bench/record_overhead.py --examples ddp-sleep moe-sleep pp-sleep   # sleep compute, ≥ 50 ms steps
    PRISM_MEMORY=rss python bench/record_overhead.py     # without the tracked CPU peak (its share)
    python bench/record_overhead.py --examples tp-sleep --threads   # + CPU ms/step per kind of thread
    python bench/record_overhead.py --examples tp-sleep --record-env PRISM_OPWATCH=0   # + record without the op publisher

JSON goes to ``--out`` (default bench/results/record_overhead.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _plain_launch import launch_plain

from prism.core.config import load_job
from prism.core.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
W = 4

# example -> (job file, arguments at W=4 without --steps, parallelism at W=4)
EXAMPLES: dict[str, tuple[str, tuple[str, ...], dict[str, int]]] = {
    "ddp": ("examples/ddp/job.yaml", (), {"dp": 4}),
    "fsdp2": ("examples/fsdp2/job.yaml", (), {"dp": 4}),
    "tp": ("examples/tp/job.yaml", ("--tp", "2"), {"dp": 2, "tp": 2}),
    "pp": ("examples/pp/job.yaml", ("--pp", "4", "--schedule", "1f1b"), {"dp": 1, "pp": 4}),
    "moe": ("examples/moe/job.yaml", ("--ep", "4"), {"dp": 4, "ep": 4}),
    "hybrid": ("examples/hybrid/job.yaml", ("--pp", "2", "--dp", "1", "--tp", "2"), {"dp": 1, "tp": 2, "pp": 2}),
    "synthetic": ("examples/synthetic/job.yaml",
                  ("--dp", "1", "--pp", "4", "--microbatches", "4", "--fwd-ms", "5", "--bwd-ms", "10"),
                  {"dp": 1, "pp": 4}),
    # Each structure with sleep compute (the examples' --sleep-ms; steps of 50 ms and more, which
    # the host's load does not stretch): where #11 asks for 1 %.
    "ddp-sleep": ("examples/ddp/job.yaml", ("--sleep-ms", "10"), {"dp": 4}),
    "fsdp2-sleep": ("examples/fsdp2/job.yaml", ("--sleep-ms", "10"), {"dp": 4}),
    "tp-sleep": ("examples/tp/job.yaml", ("--tp", "2", "--sleep-ms", "20"), {"dp": 2, "tp": 2}),
    "pp-sleep": ("examples/pp/job.yaml", ("--pp", "4", "--schedule", "1f1b", "--sleep-ms", "2"), {"dp": 1, "pp": 4}),
    "moe-sleep": ("examples/moe/job.yaml", ("--ep", "4", "--sleep-ms", "15"), {"dp": 4, "ep": 4}),
    "hybrid-sleep": ("examples/hybrid/job.yaml", ("--pp", "2", "--dp", "1", "--tp", "2", "--sleep-ms", "10"),
                     {"dp": 1, "tp": 2, "pp": 2}),
}
PLAIN_EXAMPLES = [name for name in EXAMPLES if not name.endswith("-sleep")]


def example_job(name: str, steps: int, world: int = W):
    """The example at ``world`` ranks: its model-parallel sizes (tp, pp, cp, ep) as at W=4, data
    parallelism taking the rest; a ValueError where that does not fit (an example whose arguments
    fix ``--dp``, a world that the model-parallel sizes do not divide)."""
    path, args, shape = EXAMPLES[name]
    model = math.prod(shape.get(k, 1) for k in ("tp", "pp", "cp"))
    dp = world // model
    if world != W:
        if "--dp" in args:
            raise ValueError(f"--world {world}: {name} runs at W={W} only (its arguments fix --dp)")
        if world % model:
            raise ValueError(f"--world {world}: {name} needs a multiple of {model} ranks (tp × pp × cp)")
        if shape.get("ep", 1) > dp:
            raise ValueError(f"--world {world}: {name}'s expert parallelism {shape['ep']} needs {shape['ep']} "
                             f"data-parallel ranks, not {dp}")
    job = load_job(ROOT / path)
    parallelism = dataclasses.replace(job.parallelism, **{"tp": 1, "pp": 1, "ep": 1, "cp": 1, **shape, "dp": dp})
    return dataclasses.replace(job, args=("--steps", str(steps), *args), world_size=world, ranks_per_node=world,
                               parallelism=parallelism)


PROBE = HERE / "_step_probe"


def _steps(step_dir: Path, warmup: int) -> tuple[list[float], list[float], dict[str, float]]:
    """(wall ms, CPU ms) of every measured step of every rank the probe saw: a step is the time
    between two consecutive optimizer step ends; the first ``warmup`` and the last one (ranks
    start leaving) are dropped. With the per-thread probe (``--threads``) also each kind of
    thread's CPU ms per measured step, the median over the ranks that have it (else an empty dict)."""
    wall, cpu = [], []
    per_thread: dict[str, list[float]] = {}
    # A two-pass record's memory pass is not the recorded run.
    for path in sorted(p for p in step_dir.glob("pid-*.txt") if not p.name.endswith("-memory.txt")):
        ends = [tuple(int(x) for x in line.split()) for line in path.read_text().splitlines()]
        diffs = [((b[0] - a[0]) / 1e6, (b[1] - a[1]) / 1e6) for a, b in zip(ends, ends[1:])][warmup:-1]
        wall += [w for w, _ in diffs]
        cpu += [c for _, c in diffs]
        threads = path.with_name(path.name.replace("pid-", "threads-", 1)).with_suffix(".jsonl")
        if threads.exists() and diffs:
            snaps = [json.loads(line) for line in threads.read_text().splitlines()]
            first, last = snaps[warmup], snaps[warmup + len(diffs)]  # the measured steps' ends
            for name, ns in last.items():
                per_thread.setdefault(name, []).append((ns - first.get(name, 0)) / 1e6 / len(diffs))
    shutil.rmtree(step_dir)
    return wall, cpu, {name: statistics.median(v) for name, v in per_thread.items()}


def _probe_env(step_dir: Path, tree: Path | None = None) -> dict[str, str]:
    step_dir.mkdir(parents=True)
    path = os.pathsep.join(str(p) for p in (tree, PROBE) if p is not None)
    return {"PRISM_BENCH_STEP_DIR": str(step_dir), "PYTHONPATH": path,
            "PRISM_BENCH_THREADS": os.environ.get("PRISM_BENCH_THREADS", "0")}


def plain_run(job, warmup: int, timeout_s: float) -> tuple[float, float, dict[str, float]]:
    """Median (wall, CPU) ms/step of a plain launch (all ranks, measured steps), and per kind of
    thread its CPU ms/step (with ``--threads``)."""
    step_dir = Path(tempfile.mkdtemp(prefix="prism-plain-")) / "steps"
    env = {**job.env, **_probe_env(step_dir)}
    launch_plain(job.script_path, job.args, job.world_size, env=env, timeout_s=timeout_s,
                 on_retry=lambda: [f.unlink() for f in step_dir.glob("*")])
    wall, cpu, threads = _steps(step_dir, warmup)
    return statistics.median(wall), statistics.median(cpu), threads


def record_run(job, warmup: int, timeout_s: float, tree: Path = ROOT,
               extra_env: dict[str, str] | None = None) -> tuple[float, float, dict[str, float]]:
    """As :func:`plain_run`, under ``prism record`` of the prism in ``tree`` (all ranks), with
    ``extra_env`` in the environment of prism and of every rank."""
    with tempfile.TemporaryDirectory(prefix="prism-rec-") as tmp:
        RunDir(Path(tmp) / "job").save_job(job)
        step_dir = Path(tmp) / "steps"
        env = {**os.environ, **(extra_env or {}), **_probe_env(step_dir, tree)}
        proc = subprocess.run([sys.executable, "-m", "prism.cli.main", "record", "--job", str(Path(tmp) / "job/job.yaml"),
                               "--out", str(Path(tmp) / "run"), "--timeout", str(timeout_s)],
                              env=env, cwd=str(tree), capture_output=True, timeout=timeout_s + 60)
        if proc.returncode:
            raise RuntimeError(f"prism record of {job.name} ({tree}) exited {proc.returncode}:\n"
                               f"{proc.stderr.decode()[-2000:]}")
        wall, cpu, threads = _steps(step_dir, warmup)
    return statistics.median(wall), statistics.median(cpu), threads


def _row(name: str, job, sides: dict[str, list[tuple]]) -> tuple[dict, str]:
    """The example's JSON row and printed line(s) from the runs so far (medians per side)."""
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in sides.items()}
    pw, pc = med["plain"]
    row = {"args": list(job.args)}
    line = f"{name:10s} plain {pw:8.2f} ms (cpu {pc:7.2f})"
    threads = {}
    for side, (w, c) in med.items():
        row[side] = {"wall_ms": [round(r[0], 3) for r in sides[side]], "cpu_ms": [round(r[1], 3) for r in sides[side]],
                     "wall_median_ms": round(w, 3), "cpu_median_ms": round(c, 3)}
        names = {n for r in sides[side] for n in r[2]}
        if names:  # a thread kind missing from a run spent nothing there
            threads[side] = {n: statistics.median(r[2].get(n, 0.0) for r in sides[side]) for n in names}
            row[side]["thread_cpu_ms_per_step"] = {n: round(v, 3) for n, v in sorted(threads[side].items())}
        if side != "plain":
            row[side].update(wall_overhead_pct=round(100 * (w / pw - 1), 2), cpu_overhead_pct=round(100 * (c / pc - 1), 2))
            line += f"  {side} {w:8.2f} ms {100 * (w / pw - 1):+6.1f} % (cpu {c:7.2f} {100 * (c / pc - 1):+6.1f} %)"
    if "record" in threads:
        plain = threads.get("plain", {})
        diff = {n: threads["record"].get(n, 0.0) - plain.get(n, 0.0) for n in {*plain, *threads["record"]}}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:6]
        line += "\n    cpu ms/step by thread, record - plain: " + ", ".join(f"{n} {d:+.2f}" for n, d in top)
    return row, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", nargs="+", default=PLAIN_EXAMPLES, choices=list(EXAMPLES),
                        help="default: the examples at their own compute (the -sleep variants on request)")
    parser.add_argument("--world", type=int, default=W,
                        help=f"ranks (default {W}); the examples' model-parallel sizes stay, dp takes the rest")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="measured step diffs dropped at the start")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also record with the prism in this directory (alternated): before/after")
    parser.add_argument("--label", default="", help="a name for this set of figures (e.g. before/after)")
    parser.add_argument("--record-env", action="append", default=[], metavar="KEY=VALUE",
                        help="also record with this in the environment (alternated; repeatable): e.g. "
                             "PRISM_OPWATCH=0 for the op publisher's share")
    parser.add_argument("--threads", action="store_true",
                        help="also each kind of thread's CPU ms per step, per side (which thread record's CPU goes to)")
    parser.add_argument("--out", default=str(HERE / "results/record_overhead.json"))
    ns = parser.parse_args()
    bad = [kv for kv in ns.record_env if "=" not in kv or not kv.split("=", 1)[0]]
    if bad:
        parser.error(f"--record-env: {bad[0]!r} is not KEY=VALUE")
    record_env = dict(kv.split("=", 1) for kv in ns.record_env)
    logging.basicConfig(level=logging.WARNING)
    if ns.threads:
        os.environ["PRISM_BENCH_THREADS"] = "1"  # read by _probe_env, inherited by every rank
    results = {}

    def write() -> None:
        # after every repeat, so a run cut short by a time limit keeps what it measured
        out = {"world_size": ns.world, "steps": ns.steps, "warmup": ns.warmup, "repeats": ns.repeats, "label": ns.label,
               "baseline_tree": str(ns.baseline_tree) if ns.baseline_tree else None, "record_env": record_env,
               "memory": os.environ.get("PRISM_MEMORY", "tracked"), "host_cpus": os.cpu_count(),
               "load_average": os.getloadavg(), "examples": results}
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(ns.out).with_suffix(".partial")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(ns.out)

    for name in ns.examples:
        job = example_job(name, ns.steps, ns.world)
        sides: dict[str, list[tuple]] = {"plain": [], "record": []}
        if ns.baseline_tree:
            sides["baseline"] = []
        if record_env:
            sides["record_env"] = []
        for k in range(ns.repeats):  # alternated, so every side sees the same host load
            sides["plain"].append(plain_run(job, ns.warmup, ns.timeout))
            sides["record"].append(record_run(job, ns.warmup, ns.timeout))
            if ns.baseline_tree:
                sides["baseline"].append(record_run(job, ns.warmup, ns.timeout, ns.baseline_tree.resolve()))
            if record_env:
                sides["record_env"].append(record_run(job, ns.warmup, ns.timeout, extra_env=record_env))
            row, line = _row(name, job, sides)
            results[name] = {**row, "repeats_done": k + 1}
            write()
            print(f"{line}  [{k + 1} of {ns.repeats} repeats]" if k + 1 < ns.repeats else line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
