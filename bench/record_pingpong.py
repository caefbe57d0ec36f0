"""The recorder's cost per point-to-point message: a 4 KiB send/recv ping-pong between two ranks
(``bench/_debug/p2p_pingpong.py``), alternated per repeat as

* **plain**: the script under torchrun's environment, gloo, no prism;
* **record**: ``prism record`` as its timed pass runs the job (``PRISM_MEMORY=rss``,
  ``--no-memory-pass``: no tracker), every message through prism's process group, recorder and
  passthrough engine;
* **own-group** (the control): the same record worker, but the script's messages go over a
  ProcessGroupGloo it builds itself as passthrough builds one, bypassing prism's path;
* **baseline** (``--baseline-tree DIR``): ``record`` with the prism in DIR (a before/after pair).

A pipeline's step is a chain of such messages (pp-sleep +4.3 % and hybrid-sleep +4.6 % wall under
``prism record`` on 16 cores, session 20), so the round trip under record against plain and against
the control says how much of a message is prism's path and how much the rank process.

    python bench/record_pingpong.py --repeats 5 --iters 3000
    python bench/record_pingpong.py --baseline-tree /tmp/main-before
    python bench/record_pingpong.py --op allreduce       # a collective's cost, waited at once

JSON goes to ``--out`` (default bench/results/record_pingpong.json): per side the round trips and
process CPU (µs, rank 0) of every repeat and their medians.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _plain_launch import launch_plain  # noqa: E402

SCRIPT = HERE / "_debug" / "p2p_pingpong.py"
LINE = re.compile(r"([\d.]+) us per round trip, cpu ([\d.]+) us")


def _read(out: Path) -> tuple[float, float]:
    m = LINE.search(out.read_text())
    if m is None:
        raise RuntimeError(f"{out}: no round-trip line from rank 0")
    return float(m.group(1)), float(m.group(2))


def plain(iters: int, tmp: Path, op: str) -> tuple[float, float]:
    out = tmp / "plain.txt"
    launch_plain(SCRIPT, ["--iters", str(iters), "--op", op], 2, env={"PINGPONG_OUT": str(out)}, timeout_s=300,
                 on_retry=lambda: out.unlink(missing_ok=True))
    return _read(out)


def record(iters: int, tmp: Path, tree: Path, op: str, *, own_group: bool = False) -> tuple[float, float]:
    job = tmp / "job.yaml"
    args = ["--iters", str(iters), "--op", op] + (["--own-group"] if own_group else [])
    job.write_text(yaml.safe_dump({"name": "pingpong", "entrypoint": str(SCRIPT), "args": args, "env": {},
                                   "world_size": 2, "ranks_per_node": 2, "device": "cpu",
                                   "iterations": {"warmup": 0, "measured": 1}, "slots": 2}))
    out = tmp / "record.txt"
    env = {**os.environ, "PINGPONG_OUT": str(out), "PRISM_MEMORY": "rss", "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-m", "prism.cli.main", "record", "--no-memory-pass", "--job", str(job),
                           "--out", str(tmp / "run")], env=env, cwd=str(tree), capture_output=True, timeout=360)
    if proc.returncode:
        raise RuntimeError(f"prism record of the ping-pong ({tree}) exited {proc.returncode}:\n"
                           f"{proc.stderr.decode()[-2000:]}")
    return _read(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3000, help="timed round trips per run (after 200 warm-up ones)")
    parser.add_argument("--op", choices=["sendrecv", "allreduce", "allreduce-async", "funcol"], default="sendrecv",
                        help="a round trip is a send and a receive, or one 4 KiB all_reduce (waited at once, "
                             "issued with async_op=True, then waited, or functional with its wait_tensor)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also record with the prism in this directory (alternated): before/after")
    parser.add_argument("--out", default=str(HERE / "results/record_pingpong.json"))
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sides = ["plain", "record", "own-group"] + (["baseline"] if ns.baseline_tree else [])
    runs: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for k in range(ns.repeats):  # alternated, so every side sees the same host
        for side in sides:
            with tempfile.TemporaryDirectory(prefix=f"prism-pingpong-{side}-") as tmp:
                if side == "plain":
                    runs[side].append(plain(ns.iters, Path(tmp), ns.op))
                elif side == "baseline":
                    runs[side].append(record(ns.iters, Path(tmp), ns.baseline_tree.resolve(), ns.op))
                else:
                    runs[side].append(record(ns.iters, Path(tmp), ROOT, ns.op, own_group=side == "own-group"))
        print(f"repeat {k + 1}/{ns.repeats}: " + ", ".join(f"{s} {runs[s][-1][0]:.1f} us" for s in sides), flush=True)
    result = {"op": ns.op, "iters": ns.iters, "repeats": ns.repeats, "host_cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "baseline_tree": str(ns.baseline_tree) if ns.baseline_tree else None, "sides": {}}
    plain_us = statistics.median(us for us, _ in runs["plain"])
    for side, takes in runs.items():
        us, cpu = statistics.median(t[0] for t in takes), statistics.median(t[1] for t in takes)
        result["sides"][side] = {"round_trip_us": [t[0] for t in takes], "cpu_us": [t[1] for t in takes],
                                 "round_trip_median_us": us, "cpu_median_us": cpu, "vs_plain": round(us / plain_us, 3)}
        print(f"{side:10s} round trip {us:8.1f} us ({us / plain_us:4.2f}x plain), cpu {cpu:8.1f} us")
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
