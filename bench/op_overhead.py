"""The emulator's own cost per op: a sandbox rank's time in an emulated op vs the real backend.

For each op kind (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send/recv on a
ring batched, and isend/irecv on a ring posted one by one as a hand-written pipeline does) and size
(4 KiB to 16 MiB), the job ``bench/_op_loop.py`` times ``--iters`` iterations of barrier + op (issue
to completion) on every rank. It runs, per size, as

* **real**: W processes started as torchrun starts them, plain gloo, no prism;
* **emulated**: ``emulate`` (prism/vrank_replayer/launch.py) with one and with two sandbox ranks
  (``live`` engine) and one replayer hosting the other W − k ranks as vranks, answering as soon
  as they can (no timed graph): the sandbox rank's time is the emulator's own cost plus the real
  transfers with its neighbor vranks. Graph and recorded data come from one capture run
  (``capture_job``: all W ranks under the ``live`` engine), whose graph is the structure the
  replayer walks.

Reported per (op, size): the median per-iteration time of the real run (over all ranks) and of
each emulation (over its sandbox ranks), their ratio and difference (the overhead), and per
emulation the replayer's CPU time per op it served (barriers included) — its cost per vrank op —
and its channel threads' own CPU per op, message streams and collective channels apart
(``replayer_message_cpu_us``, ``replayer_collective_cpu_us``: the Python each op costs the thread
that serves it, under the replayer's one GIL).

    python bench/op_overhead.py                              # W=4, sizes 4 KiB .. 16 MiB
    python bench/op_overhead.py --world 8 --sizes 4096,1048576
    python bench/op_overhead.py --world 8 --sizes 16384 --sandboxes 2,5 --device-paths host,lanes

``--busy-us N``: the script's thread runs N µs of Python between each issue and its wait (a TP
layer's DTensor code after its all-reduce): in the real run gloo's thread runs the op meanwhile; in an
emulation the op's channel thread shares the GIL with it. With ``PRISM_LIVE_EARLY_START=1`` exported,
the emulations begin small collectives on the script's thread (docs/emulate.md, session 43).

``--device-paths``: each emulation on the CPU data paths given: ``host`` (the sandbox rank runs the
pruned ring steps against its neighbor vranks) and ``lanes`` (each op delegated to the replayer:
one send and one receive on the sandbox; columns suffixed ``_lanes``).

JSON goes to ``--out`` (default bench/results/op_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _plain_launch import launch_plain

from prism.core.config import job_from_dict
from prism.core.rundir import RunDir
from prism.core.workerspec import record_path
from prism.graph.io import write_graph
from prism.sandbox.launch import assemble_graph
from prism.vrank_replayer import EmulateOptions
from prism.vrank_replayer.launch import capture_job, emulate

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_op_loop.py"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv", "isend_irecv")
ITERS = {4096: 20, 65536: 20, 1048576: 10, 16777216: 3}
"""Timed iterations per size; a size between two keys takes the smaller key's count."""


def iterations(size: int, scale: float) -> int:
    key = max((s for s in ITERS if s <= size), default=min(ITERS))
    return max(1, round(ITERS[key] * scale))


def _times(out: Path, ranks) -> dict[str, list[float]]:
    """Per ``op/bytes``: every iteration's seconds of the given ranks (files moved away after)."""
    merged: dict[str, list[float]] = {}
    for r in ranks:
        for key, ts in json.loads((out / f"rank-{r}.json").read_text()).items():
            merged.setdefault(key, []).extend(ts)
    shutil.rmtree(out)
    return merged


def measure_size(world: int, size: int, sandboxes: list[tuple[int, ...]], work: Path, timeout_s: float,
                 ops: str = ",".join(OPS), iters_scale: float = 1.0, device_paths: tuple[str, ...] = ("host",),
                 busy_us: float = 0.0) -> dict:
    times_dir = work / "times"
    iters = iterations(size, iters_scale)
    args = ["--ops", ops, "--sizes", str(size), "--iters", str(iters), "--busy-us", str(busy_us), "--out", str(times_dir)]
    job = job_from_dict({"name": f"op-overhead-{size}", "entrypoint": str(SCRIPT), "args": args,
                         "world_size": world, "ranks_per_node": world, "device": "cpu"}, base_dir=str(HERE))
    launch_plain(SCRIPT, args, world, timeout_s=timeout_s)
    real = _times(times_dir, range(world))
    run = RunDir(work / f"run-{size}")
    union = tuple(sorted({r for s in sandboxes for r in s}))
    capture = capture_job(job, run.root, derive_for=union, timeout_s=timeout_s)
    records = [pickle.loads(record_path(capture / "workers", r).read_bytes()) for r in range(world)]
    write_graph(assemble_graph(job, records, kind="real"), run.graph_dir("real"))
    shutil.rmtree(times_dir)  # the capture run's own times
    emulated = {}
    for sandbox in sandboxes:
        for path in device_paths:
            name = "_".join(map(str, sandbox)) + ("" if path == "host" else f"_{path}")
            # One untracked emulation: with the default memory pass the tracked pass runs second
            # and its times (the tracker's cost per aten op included) would overwrite the timed one's.
            res = emulate(run.root, EmulateOptions(ranks=sandbox, timeout_s=timeout_s, device_path=path,
                                                   out_dir=str(work / f"emu-{size}-{name}"), memory="untracked"))
            rep = json.loads((res.out_dir / "replayer-000.json").read_text())
            emulated[(sandbox, name)] = (_times(times_dir, sandbox), rep)
    shutil.rmtree(run.root / "capture")
    rows = {}
    for key, ts in real.items():
        if key.endswith(("/cpu", "/script_cpu")):
            continue
        op = key.split("/")[0]
        row = {"op": op, "bytes": size, "real_ms": round(1e3 * statistics.median(ts), 4),
               "real_cpu_ms": round(1e3 * statistics.median(real[key + "/cpu"]), 4),
               "real_script_cpu_us": round(1e6 * statistics.median(real[key + "/script_cpu"]), 1)}
        for (_, suffix), (emu, rep) in emulated.items():
            name = "sandbox_" + suffix
            e = 1e3 * statistics.median(emu[key])
            row[name] = {"emulated_ms": round(e, 4), "overhead_ms": round(e - row["real_ms"], 4),
                         "ratio": round(e / row["real_ms"], 3),
                         "emulated_cpu_ms": round(1e3 * statistics.median(emu[key + "/cpu"]), 4),
                         "emulated_script_cpu_us": round(1e6 * statistics.median(emu[key + "/script_cpu"]), 1),
                         "replayer_cpu_us_per_op": round(1e6 * rep["cpu_s"] / max(1, rep["num_ops"]), 1),
                         "replayer_ops": rep["num_ops"], **_channel_cpu(rep)}
        rows[key] = row
    return rows


def _channel_cpu(rep: dict) -> dict:
    """The replayer's channel threads' own CPU per op they served, message streams (``a->b``) and
    collective channels apart (session 42; a send's helper thread is not counted)."""
    out = {}
    cpu, ops = rep.get("channel_cpu_s", {}), rep.get("channel_ops", {})
    for kind, is_message in (("message", True), ("collective", False)):
        names = [n for n in cpu if ("->" in n) == is_message]
        if names and sum(ops.get(n, 0) for n in names):
            out[f"replayer_{kind}_cpu_us"] = round(1e6 * sum(cpu[n] for n in names) / sum(ops.get(n, 0) for n in names), 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--sizes", default="4096,65536,1048576,16777216")
    parser.add_argument("--sandboxes", default="1;1,2", help="sandbox sets, ';'-separated")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--device-paths", default="host",
                        help="CPU data paths, ','-separated: host (the sandbox runs the pruned steps), lanes (delegated)")
    parser.add_argument("--iters-scale", type=float, default=1.0, help="times the default iterations per size")
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="the script's thread runs Python this long between each issue and its wait (µs)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default=str(HERE / "results/op_overhead.json"))
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sandboxes = [tuple(int(r) for r in s.split(",")) for s in ns.sandboxes.split(";")]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="prism-op-overhead-") as tmp:
        for size in (int(s) for s in ns.sizes.split(",")):
            t0 = time.perf_counter()
            rows.update(measure_size(ns.world, size, sandboxes, Path(tmp), ns.timeout, ns.ops, ns.iters_scale,
                                     tuple(ns.device_paths.split(",")), ns.busy_us))
            print(f"-- {size} bytes: {time.perf_counter() - t0:.0f} s", flush=True)
            for key, row in rows.items():
                if row["bytes"] != size:
                    continue
                cells = "  ".join(f"{k[8:]}: {v['emulated_ms']:8.3f} ms cpu {v['emulated_cpu_ms']:.3f} "
                                  f"script {v['emulated_script_cpu_us']:.0f} us "
                                  f"({v['overhead_ms']:+.3f}, replayer {v['replayer_cpu_us_per_op']:.0f} us/op"
                                  + "".join(f", {k[9:-7]} thread {x:.0f} us" for k, x in v.items() if k.startswith("replayer_") and k.endswith("_cpu_us"))
                                  + ")"
                                  for k, v in row.items() if k.startswith("sandbox_"))
                print(f"{row['op']:15s} {size:>9d} B  real {row['real_ms']:8.3f} ms cpu {row['real_cpu_ms']:.3f} "
                      f"script {row['real_script_cpu_us']:.0f} us  {cells}",
                      flush=True)
    out = {"world_size": ns.world, "sandboxes": [list(s) for s in sandboxes], "device_paths": ns.device_paths.split(","),
           "label": ns.label, "busy_us": ns.busy_us, "early_start": os.environ.get("PRISM_LIVE_EARLY_START") == "1",
           "host_cpus": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3], "ops": rows}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
