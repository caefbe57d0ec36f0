"""CPU per op of the pruned collectives' own Python, without processes or a loaded scheduler in
the way: one sandbox rank's side (``run_sandbox_side``, what the ``live`` engine's channel thread
runs per op) and the replayer's side (``NeighborParty`` + ``start_party``, what its channel thread
runs per op) in two threads of this process over a real gloo transport, W ranks, sandbox {1}, the
other ranks' neighbors hosted by the second endpoint. Reported: each thread's CPU time
(``time.thread_time``) per op and the sandbox side's wall time per op, median of ``--rounds``
rounds of ``--ops`` ops. Run it from two trees alternately to compare them (``--tree``).

``--processes``: the two sides in two processes, as the sandbox rank and the replayer are (no
shared GIL): the wall time per op is then the op's latency, message hand-shakes included.

    python bench/pruned_op_cpu.py --tree /tmp/before --tree . --rounds 5
    python bench/pruned_op_cpu.py --tree /tmp/before --tree . --rounds 5 --processes --world 8 --numel 4096
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

KINDS = ("all_reduce", "all_gather", "broadcast", "barrier")


def _child(world: int, numel: int, num_ops: int, sides: tuple[str, ...] = ("sandbox", "replayer"),
           port: int = 0) -> dict:
    """Run ``sides`` (both, in two threads, or one of them) of ``num_ops`` ops per kind; ``port``:
    the store of a parent that runs the other side in another process (0: this process's own)."""
    import torch
    import torch.distributed as dist

    from prism.nccl_patches import Transport, neighbor_ranks, pruned_steps, record_for_sandbox, run_sandbox_side
    from prism.nccl_patches.parties import NeighborParty
    from prism.nccl_patches.pruned import start_party
    from prism.nccl_patches.schedule import Algo
    from prism.nccl_patches.vplan import barrier_record

    me = 1
    timeout = datetime.timedelta(seconds=60)
    if not port:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        port = store.port
    endpoint_of = {r: (0 if r == me else 1) for r in range(world)}
    side_endpoint = {"sandbox": 0, "replayer": 1}
    ends: list = [None, None]

    def join(e: int) -> None:  # a client each: one client serializes its requests (a wait holds up a set)
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timeout)
        ends[e] = Transport.connect(client, e, 2, endpoint_of, timeout_s=60, prefix="b")

    ts = [threading.Thread(target=join, args=(side_endpoint[side],)) for side in sides]
    [t.start() for t in ts]
    [t.join() for t in ts]
    out = {}
    for kind in KINDS:
        if kind == "barrier":
            algo, op, data = Algo.RING_ALL_REDUCE, "sum", [torch.zeros(1, dtype=torch.int32)] * world
        elif kind == "all_reduce":
            algo, op, data = Algo.RING_ALL_REDUCE, "sum", [torch.full((numel,), float(r + 1)) for r in range(world)]
        elif kind == "all_gather":
            algo, op, data = Algo.RING_ALL_GATHER, "", [torch.full((numel // world,), float(r + 1)) for r in range(world)]
        else:
            algo, op, data = Algo.CHAIN_BROADCAST, "", [torch.full((numel,), 1.0)] * world
        rec = record_for_sandbox(data, algo, op, [me], root=0)
        cpu = {}

        def sandbox() -> None:
            c0, w0 = time.thread_time(), time.perf_counter()
            for seq in range(num_ops):
                r = barrier_record(world, [me]) if kind == "barrier" else rec
                run_sandbox_side(ends[0], algo, me, data[me], group_size=world, reduce_op=op, root=0,
                                 recorded=r, tag_base=(seq % 64) * 2 * world * world, timeout_s=60)
            cpu["sandbox"] = time.thread_time() - c0
            cpu["wall"] = time.perf_counter() - w0

        def replayer() -> None:
            c0 = time.thread_time()
            for seq in range(num_ops):
                r = barrier_record(world, [me]) if kind == "barrier" else rec
                pruned = pruned_steps(r)
                party = NeighborParty(r, neighbor_ranks(r, pruned), pruned)
                start_party(party, ends[1], world, tag_base=(seq % 64) * 2 * world * world, timeout_s=60)()
            cpu["replayer"] = time.thread_time() - c0

        with torch.no_grad():
            ts = [threading.Thread(target={"sandbox": sandbox, "replayer": replayer}[side]) for side in sides]
            [t.start() for t in ts]
            [t.join() for t in ts]
        out[kind] = {side: 1e6 * v / num_ops for side, v in cpu.items()}
    return out


def _one_round(tree: str, ns: argparse.Namespace) -> dict:
    env = {"PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    args = [sys.executable, __file__, "--child", "--world", str(ns.world), "--numel", str(ns.numel), "--ops", str(ns.ops)]
    if not ns.processes:
        res = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    children = [subprocess.Popen(args + ["--side", side, "--port", str(store.port)], env=env,
                                 stdout=subprocess.PIPE, text=True) for side in ("sandbox", "replayer")]
    merged: dict = {}
    for child in children:
        stdout, _ = child.communicate(timeout=600)
        if child.returncode:
            raise RuntimeError(f"a child of {tree} failed (exit {child.returncode})")
        for kind, sides in json.loads(stdout.strip().splitlines()[-1]).items():
            merged.setdefault(kind, {}).update(sides)
    return merged


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[], help="prism trees to compare (default: this one)")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--numel", type=int, default=1024, help="float32 elements (1024: 4 KiB)")
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="")
    p.add_argument("--processes", action="store_true", help="the two sides in two processes")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", action="append", choices=("sandbox", "replayer"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(_child(ns.world, ns.numel, ns.ops, tuple(ns.side or ("sandbox", "replayer")), ns.port)))
        return 0
    trees = [str(Path(t).resolve()) for t in (ns.tree or ["."])]
    rounds: dict[str, list[dict]] = {t: [] for t in trees}
    for _ in range(ns.rounds):
        for tree in trees:  # alternated, so the host's load falls on every tree alike
            rounds[tree].append(_one_round(tree, ns))
    summary = {t: {k: {side: round(statistics.median(r[k][side] for r in rs), 1) for side in ("sandbox", "replayer", "wall")}
                   for k in KINDS} for t, rs in rounds.items()}
    for t, kinds in summary.items():
        print(t)
        for k, v in kinds.items():
            print(f"  {k:11s} sandbox {v['sandbox']:7.1f} us/op   replayer {v['replayer']:7.1f} us/op   "
                  f"wall {v['wall']:7.1f} us/op")
    if ns.out:
        Path(ns.out).write_text(json.dumps({"world": ns.world, "numel": ns.numel, "ops": ns.ops, "rounds": ns.rounds,
                                            "processes": ns.processes,
                                            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                                            "median_us_per_op": summary, "all": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
