"""Record a real run under your own launcher: the one-line change is ``-m prism.record --out RUN``.

    torchrun --nproc-per-node 8 train.py --steps 4
    torchrun --nproc-per-node 8 -m prism.record --out RUN train.py --steps 4

    srun python -m prism.record --out RUN train.py --steps 4     # RANK/WORLD_SIZE from Slurm

Each rank runs the unmodified script under the shim with the ``passthrough`` engine (the real
gloo/NCCL backend does the communication), writes its record to ``RUN/ranks/``, and checks in
with the launcher's store; rank 0 then assembles ``RUN/graph/real`` and ``RUN/job.yaml``. RUN must
be on a file system that every node sees. The store is at MASTER_ADDR:MASTER_PORT (default
127.0.0.1:29500): torchrun's agent hosts it, under other launchers rank 0 does. A RUN that holds
another program's run is refused by every rank before the script starts (``RunDir.claim``).
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import sys
import time
import traceback
from pathlib import Path

from prism.core.atomic import atomic_write_bytes, atomic_write_text
from prism.core.config import job_from_dict
from prism.core.errors import PrismError
from prism.core.rundir import RunDir
from prism.core.workerspec import ShimConfig, WorkerSpec, record_path

__all__ = ["main"]

log = logging.getLogger("prism.record")


def _env_int(*names: str, default: int | None = None) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    if default is None:
        raise SystemExit(f"prism.record: none of {', '.join(names)} is set; run it under torchrun or srun")
    return default


def _host_store(rank: int, world: int, host: str, port: int, timeout_s: float):
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, which every rank's shim joins as a client.
    torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE=True`` in its workers); under any other
    launcher (srun, a plain shell) rank 0 hosts it, as ``init_process_group``'s ``env://`` does."""
    if rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    import datetime

    import torch.distributed as dist

    return dist.TCPStore(host, port, world, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="run directory (shared by all nodes)")
    parser.add_argument("--name", default=None, help="job name (default: the script's name)")
    parser.add_argument("--cuda-backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--boundary", default="", help="where a step ends, as iterations.boundary (docs/job-file.md)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="leading steps left out of the measured peak and step times (iterations.warmup)")
    parser.add_argument("--measured", type=int, default=3,
                        help="steps after the warmup that the measured peak covers (iterations.measured)")
    parser.add_argument("-m", dest="module", default=None, help="run a module instead of a script")
    parser.add_argument("script", nargs="?", help="training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = parser.parse_args(argv)
    if not ns.module and not ns.script:
        parser.error("give a script or -m module")
    logging.basicConfig(level=os.environ.get("PRISM_LOG_LEVEL", "WARNING"))

    from prism.graph.io import write_graph
    from prism.graph.memory_pass import TRACKED_INLINE, needs_memory_pass
    from prism.sandbox.launch import assemble_graph
    from prism.sandbox.worker import run_rank

    rank = _env_int("RANK", "SLURM_PROCID")
    world = _env_int("WORLD_SIZE", "SLURM_NTASKS")
    local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
    local_world = _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=world)
    if "MASTER_ADDR" not in os.environ and int(os.environ.get("SLURM_NNODES", "1")) > 1:
        raise SystemExit("prism.record: MASTER_ADDR is not set and the job spans "
                         f"{os.environ['SLURM_NNODES']} nodes; export MASTER_ADDR (the host of rank 0, e.g. "
                         "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)) and MASTER_PORT before srun")
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT", default=29500)
    entry = f"-m {ns.module}" if ns.module else str(Path(ns.script).resolve())
    args = tuple(([ns.script] if ns.module and ns.script else []) + list(ns.args))
    device = "cuda" if os.environ.get("PRISM_DEVICE", "") == "cuda" else "cpu"
    try:
        import torch

        if torch.cuda.is_available() and os.environ.get("PRISM_DEVICE", "") != "cpu":
            device = "cuda"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    name = ns.name or (ns.module or Path(ns.script).stem)
    job = job_from_dict(
        {"name": name, "entrypoint": entry, "args": list(args), "world_size": world,
         "ranks_per_node": local_world, "device": device,
         "iterations": {"warmup": ns.warmup, "measured": ns.measured,
                        **({"boundary": ns.boundary} if ns.boundary else {})}},
        base_dir=os.getcwd(),
    )
    run = RunDir(Path(ns.out))
    try:  # every rank checks (it only reads), so all of them stop, not rank 0 alone
        run.claim(job, remedy="remove it, or choose another --out")
    except PrismError as e:
        raise SystemExit(f"prism.record: {e}") from None
    ranks_dir = run.root / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    server = _host_store(rank, world, host, port, ns.timeout)  # noqa: F841 - serves the others until rank 0 exits
    spec = WorkerSpec(
        shim=ShimConfig(rank=rank, world_size=world, local_rank=local_rank, ranks_per_node=local_world,
                        device=device, store_addr=f"{host}:{port}", timeout_s=ns.timeout,
                        boundary=ns.boundary),
        engine="passthrough",
        entrypoint=entry,
        args=args,
        cwd=os.getcwd(),
        out_dir=str(ranks_dir),
        cuda_backend=ns.cuda_backend,
        warmup_steps=ns.warmup,
        measured_steps=ns.measured,
    )
    try:
        record = run_rank(spec)
    except BaseException:
        atomic_write_text(ranks_dir / f"rank-{rank:05d}.error", traceback.format_exc())
        raise
    atomic_write_bytes(record_path(ranks_dir, rank), pickle.dumps(record))

    from prism.sandbox.shim import current_sandbox

    store = current_sandbox().store
    store.add("prism/record/done", 1)
    if rank != 0:
        return 0
    deadline = time.monotonic() + ns.timeout
    while store.add("prism/record/done", 0) < world:
        if time.monotonic() > deadline:
            raise SystemExit(f"prism.record: only {store.add('prism/record/done', 0)} of {world} ranks finished")
        time.sleep(0.05)
    run.save_job(job)
    records = [pickle.loads(record_path(ranks_dir, r).read_bytes()) for r in range(world)]
    graph = assemble_graph(job, records, kind="real")
    if needs_memory_pass(job):  # one run, the tracker in its steps (docs/timing.md)
        graph.meta["memory"] = TRACKED_INLINE
    write_graph(graph, run.graph_dir("real"))
    log.warning("prism.record: wrote %s", run.graph_dir("real"))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
