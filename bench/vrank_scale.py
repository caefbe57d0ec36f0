"""Virtual ranks at scale: launch -> first collective, memory and connections, flat in W.

For W = 1,024 / 8,192 / 65,536 logical ranks (the hybrid example's mesh pp2 x dp(W/4) x tp2),
ranks 2 and 5 run for real (``live`` engine) and one replayer hosts every other rank. The job
(``bench/_vrank_job.py``) builds the 3-D DeviceMesh and all-reduces a tensor of zeros on its TP
group, then on its DP group (W/4 ranks).

Graph and recorded data are synthesized, not collected (W processes are what we avoid):
* the graph holds only the sandbox ranks' nodes: ``prism walk`` (the fake engine, one rank alone)
  gives each sandbox rank's exact op sequence and group ids at this W; the replayer reads nothing
  else;
* every input is zero, so the recording of every rank is known without running it: for a ring
  all-reduce a neighbor vrank needs the entry partial of each sandbox block (zeros) and the
  recorded inputs/outputs of the sandbox ranks (zeros). The record is built directly (not with
  ``record_for_sandbox``, whose O(n²) pass over the prefixes is what a collector does once).

Printed: a table; ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from prism.core.config import job_from_dict
from prism.core.rundir import RunDir
from prism.graph.io import write_graph
from prism.graph.records import CommOp, NodeKind
from prism.nccl_patches import Algo, RecordedCollective
from prism.nccl_patches.recorded_store import collective_key, recorded_dir, save_recorded
from prism.nccl_patches.schedule import ring_blocks
from prism.sandbox.launch import assemble_graph
from prism.sandbox.recording import walk_rank
from prism.vrank_replayer import EmulateOptions, emulate

SANDBOX = (2, 5)
JOB = Path(__file__).with_name("_vrank_job.py")


def _zeros_record(n: int, sandbox: list[int], numel: int) -> RecordedCollective:
    z = torch.zeros(numel)
    return RecordedCollective(
        Algo.RING_ALL_REDUCE, n, tuple(sandbox), reduce_op="sum",
        inputs=dict.fromkeys(sandbox, z), outputs=dict.fromkeys(sandbox, z),
        entry_partials={b[0]: z for b in ring_blocks(n, sandbox)} if len(sandbox) < n else {},
    )


def prepare(world: int, root: Path) -> tuple[Path, float]:
    job = job_from_dict({"name": f"vrank-{world}", "entrypoint": str(JOB), "world_size": world,
                         "args": ["--dp", str(world // 4)], "ranks_per_node": 8, "device": "cpu"},
                        base_dir=str(JOB.parent))
    run = RunDir(root / f"w{world}")
    run.root.mkdir(parents=True, exist_ok=True)
    run.save_job(job)
    t0 = time.perf_counter()
    records = [walk_rank(job, r, timeout_s=900) for r in SANDBOX]
    walk_s = time.perf_counter() - t0
    graph = assemble_graph(job, records, kind="bare")
    write_graph(graph, run.graph_dir("bare"))
    out = recorded_dir(run.root, SANDBOX)
    for r in SANDBOX:
        for node in graph.nodes[r]:
            if node.kind is not NodeKind.COLLECTIVE or node.op is not CommOp.ALL_REDUCE:
                continue
            members = graph.groups[node.group_id].ranks
            sandbox = [g for g, m in enumerate(members) if m in SANDBOX]
            numel = sum(math.prod(s) for s in node.shapes)
            save_recorded(out, collective_key(node.group_id, node.seq, 0), _zeros_record(len(members), sandbox, numel))
    return run.root, walk_s


def measure(world: int, root: Path, repeats: int) -> dict:
    run, walk_s = prepare(world, root)
    firsts, walls = [], []
    for _ in range(repeats):
        res = emulate(run, EmulateOptions(ranks=SANDBOX, timeout_s=900))
        firsts.append(max(v.first_op_done_s for v in res.ranks.values()))
        walls.append(res.wall_s)
    rep = res.replayers[0]
    return {
        "world_size": world,
        "walk_s": walk_s,
        "launch_to_first_collective_s": statistics.median(firsts),
        "launch_to_first_collective_runs_s": firsts,
        "wall_s": statistics.median(walls),
        "peak_rss_mib": {**{f"rank{r}": v.peak_rss_bytes / 2**20 for r, v in res.ranks.items()},
                         "replayer": rep.peak_rss_bytes / 2**20},
        "connections": {**{f"rank{r}": v.num_connections for r, v in res.ranks.items()},
                        "replayer": rep.num_connections},
        "transports": {**{f"rank{r}": v.num_transports for r, v in res.ranks.items()}, "replayer": rep.num_transports},
        "num_ops": {f"rank{r}": v.num_ops for r, v in res.ranks.items()},
        "diverged_ops": sum(len(v.diverged_ops) for v in res.ranks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="1024,8192,65536")
    p.add_argument("--repeats", type=int, default=3, help="emulations per W (the median is reported)")
    p.add_argument("--out", "--json", dest="json", default="", help="write the figures here (JSON)")
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="prism-vrank-bench-") as tmp:
        for w in (int(x) for x in ns.worlds.split(",")):
            rows.append(measure(w, Path(tmp), ns.repeats))
            r = rows[-1]
            print(f"W={w:>6}  launch->first collective {r['launch_to_first_collective_s']:6.2f} s (median of {ns.repeats})  "
                  f"(walk {r['walk_s']:5.1f} s)  peak RSS MiB {json.dumps(r['peak_rss_mib'])}  "
                  f"connections {json.dumps(r['connections'])}  ops {json.dumps(r['num_ops'])}  "
                  f"diverged {r['diverged_ops']}", flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
