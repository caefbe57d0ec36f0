"""Run the real job (all W ranks, gloo on CPU / NCCL on GPU) and record its graph into RUN/graph/real."""

from __future__ import annotations

import argparse
import dataclasses

from prism.core.config import load_job
from prism.core.units import parse_bytes
from prism.sandbox.recording import record_job

from . import add_force_argument, add_timeout_argument
from .progress import rank_progress
from .report import print_run_table

HELP = "record a real run of the job (ground truth)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job.yaml")
    p.add_argument("--out", required=True, help="run directory to write")
    add_force_argument(p)
    add_timeout_argument(p, default_s=600.0)
    p.add_argument("--cuda-backend", choices=("nccl", "gloo"), default="nccl",
                   help="real backend for CUDA tensors on a device: cuda job (gloo lets several ranks share one GPU); "
                        "a device: cpu job records on gloo alone, as it runs")
    p.add_argument("--memory-cap", type=parse_bytes, default=None, metavar="SIZE",
                   help="per-rank memory cap, e.g. 600000 or 2GiB (0: none; default: the job's memory_cap_bytes); "
                        "a rank above it fails with torch.OutOfMemoryError (exit code 3, RUN/failure.json)")
    p.add_argument("--no-memory-pass", dest="memory_pass", action="store_const", const=False, default=None,
                   help="CPU: track the peaks inside the timed run (one run instead of two, but the tracker "
                        "costs ~5 us per aten op in every measured step)")
    p.add_argument("--payloads", action="store_true",
                   help="also keep every tensor each rank received (RUN/payloads_real/), for `prism replay --values`")


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    if args.memory_cap is not None:
        job = dataclasses.replace(job, memory_cap_bytes=args.memory_cap)
    with rank_progress(f"record {job.name}", job.world_size) as progress:
        graph = record_job(job, args.out, timeout_s=args.timeout, cuda_backend=args.cuda_backend, on_progress=progress,
                           memory_pass=args.memory_pass, payloads=args.payloads, replace=args.force)
    print_run_table(graph, title=f"{job.name}: real run, W={job.world_size}")
    return 0
