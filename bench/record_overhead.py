"""The recorder's own cost: ms/step of each example under ``prism record`` vs a plain launch.

Per example (W=4, small sizes that fit the 2-core host), the job runs alternately

* plain: W processes started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/
  PORT, OMP_NUM_THREADS=1), the script's own ``init_process_group`` (gloo), no prism; a one-line
  optimizer step post hook (bench/_plain_rank.py) notes each step's end;
* record: ``prism record --job JOB --out RUN`` (a subprocess): the shim, the recorder, the memory
  tracker and the ``passthrough`` engine over real gloo groups; step times from the recorded
  summaries. ``--baseline-tree DIR`` adds a third, alternated side: ``prism record`` of the prism
  checked out in DIR (e.g. ``git worktree``/``git archive`` of the commit before a change), so a
  before/after pair is measured under the same host load.

Both measure a step as the time between two consecutive ``optimizer.step`` ends on a rank. Per run:
the median over all ranks and the measured steps (the first ``--warmup`` steps and the last one,
when ranks start leaving, are dropped); per side: the median of ``--repeats`` runs. The overhead
is record / plain − 1.

    python bench/record_overhead.py                       # every example, 3 alternated repeats
    python bench/record_overhead.py --examples moe ddp --repeats 5

JSON goes to ``--out`` (default bench/results/record_overhead.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prism.core.config import load_job
from prism.core.supervise import package_env
from prism.core.rundir import RunDir
from prism.graph.io import read_graph

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
}


def example_job(name: str, steps: int):
    path, args, shape = EXAMPLES[name]
    job = load_job(ROOT / path)
    parallelism = dataclasses.replace(job.parallelism, **{"dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1, **shape})
    return dataclasses.replace(job, args=("--steps", str(steps), *args), world_size=W, ranks_per_node=W,
                               parallelism=parallelism)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _measured(step_ms: list[float], warmup: int) -> list[float]:
    return step_ms[warmup:-1]


def plain_run(job, warmup: int, timeout_s: float) -> float:
    """Median ms/step of a plain launch (all ranks, measured steps)."""
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="prism-plain-"))
    procs = []
    for rank in range(job.world_size):
        env = package_env({"RANK": str(rank), "WORLD_SIZE": str(job.world_size), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(job.world_size), "GROUP_RANK": "0",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **job.env})
        out = work / f"rank-{rank}.json"
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "_plain_rank.py"), str(out), str(job.script_path), *job.args],
            env=env, cwd=str(job.script_path.parent), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout_s
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"plain run of {job.name}: rank {rank} did not finish in {timeout_s} s") from None
        if p.returncode:
            raise RuntimeError(f"plain run of {job.name}: rank {rank} exited {p.returncode}:\n{err.decode()[-2000:]}")
    steps: list[float] = []
    for rank in range(job.world_size):
        ends = json.loads((work / f"rank-{rank}.json").read_text())["step_ends_ns"]
        steps += _measured([(b - a) / 1e6 for a, b in zip(ends, ends[1:])], warmup)
    return statistics.median(steps)


def record_run(job, warmup: int, timeout_s: float, tree: Path = ROOT) -> float:
    """Median ms/step under ``prism record`` of the prism in ``tree`` (all ranks, measured steps)."""
    with tempfile.TemporaryDirectory(prefix="prism-rec-") as tmp:
        RunDir(Path(tmp) / "job").save_job(job)
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run([sys.executable, "-m", "prism.cli.main", "record", "--job", str(Path(tmp) / "job/job.yaml"),
                               "--out", str(run_dir), "--timeout", str(timeout_s)],
                              env=env, cwd=str(tree), capture_output=True, timeout=timeout_s + 60)
        if proc.returncode:
            raise RuntimeError(f"prism record of {job.name} ({tree}) exited {proc.returncode}:\n"
                               f"{proc.stderr.decode()[-2000:]}")
        graph = read_graph(RunDir(run_dir).graph_dir("real"))
    steps: list[float] = []
    for summary in graph.summaries.values():
        # step_times_ns[0] runs from the recorder's start; the rest are end-to-end like the plain side.
        steps += _measured([t / 1e6 for t in summary.step_times_ns[1:]], warmup)
    return statistics.median(steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="measured step diffs dropped at the start")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also record with the prism in this directory (alternated): before/after")
    parser.add_argument("--label", default="", help="a name for this set of figures (e.g. before/after)")
    parser.add_argument("--out", default=str(HERE / "results/record_overhead.json"))
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for name in ns.examples:
        job = example_job(name, ns.steps)
        plain, record, baseline = [], [], []
        for _ in range(ns.repeats):  # alternated, so every side sees the same host load
            plain.append(plain_run(job, ns.warmup, ns.timeout))
            record.append(record_run(job, ns.warmup, ns.timeout))
            if ns.baseline_tree:
                baseline.append(record_run(job, ns.warmup, ns.timeout, ns.baseline_tree.resolve()))
        p, r = statistics.median(plain), statistics.median(record)
        row = {"args": list(job.args), "plain_ms": plain, "record_ms": record,
               "plain_median_ms": round(p, 3), "record_median_ms": round(r, 3),
               "overhead_pct": round(100 * (r / p - 1), 2)}
        line = f"{name:10s} plain {p:8.2f} ms  record {r:8.2f} ms {100 * (r / p - 1):+6.1f} %"
        if baseline:
            b = statistics.median(baseline)
            row.update(baseline_ms=baseline, baseline_median_ms=round(b, 3),
                       baseline_overhead_pct=round(100 * (b / p - 1), 2))
            line += f"  baseline {b:8.2f} ms {100 * (b / p - 1):+6.1f} %"
        results[name] = row
        print(line, flush=True)
    out = {"world_size": W, "steps": ns.steps, "warmup": ns.warmup, "repeats": ns.repeats, "label": ns.label,
           "baseline_tree": str(ns.baseline_tree) if ns.baseline_tree else None,
           "host_cpus": os.cpu_count(), "examples": results}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
