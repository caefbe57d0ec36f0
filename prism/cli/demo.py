"""The whole pipeline on this machine, comparing like with like:

1. structure, values and memory on the bundled hybrid example (FSDP2 x TP x PP, W=8): record the
   real run, calibrate it slice by slice, emulate ranks 2 and 5 for real with every other rank
   virtual, and compare with the real run and with PyTorch's fake process group. Its iteration time
   is not compared: the real run's 8 ranks share this host's cores while the emulation runs 2;
2. timing on the synthetic job (sleep compute, dp 2 x pp 4 1F1B), whose real run is a valid timing
   reference on any host: the same pipeline, iteration time of the emulation vs the real run."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from prism.core.rundir import RunDir
from prism.graph.io import read_graph

from . import add_force_argument, positive_int, positive_seconds
from .report import print_run_table
from .simulate import print_simulation, simulate_run
from .validate import print_validation, validate

HELP = "record, calibrate, emulate and validate the bundled example end to end"

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEFAULT_OUT = "runs/demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--example", default="hybrid", help="example under examples/ (default: hybrid)")
    p.add_argument("--ranks", default="2,5", help="sandbox ranks to emulate (default: 2,5)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"run directory (default: {DEFAULT_OUT}, which the demo replaces when an earlier version's "
                        "example left another program's run there)")
    add_force_argument(p)
    p.add_argument("--timeout", type=positive_seconds, default=900.0)
    p.add_argument("--real-repeats", type=positive_int, default=3, metavar="N",
                   help="real runs of the example (default 3): some peaks depend on when peers arrive "
                        "(FSDP2's asynchronous reduce-scatter), and the emulated one is compared with their spread")
    p.add_argument("--timing-example", default="synthetic",
                   help="example whose iteration time is compared (default: synthetic; '' to skip)")


def run(args: argparse.Namespace) -> int:
    job_file = EXAMPLES / args.example / "job.yaml"
    console = Console(width=max(Console().width, 120))
    console.rule(f"prism demo: examples/{args.example}, sandbox ranks {args.ranks}")
    replace = args.force or args.out == DEFAULT_OUT  # the demo's own directories
    result = validate(str(job_file), args.ranks, args.out, slice_size=2, timeout_s=args.timeout, torch_fake=True,
                      real_repeats=args.real_repeats, replace=replace)
    run_dir = RunDir(Path(args.out))
    real = read_graph(run_dir.graph_dir("real"))
    print_run_table(real, title=f"{real.job_name}: real run recorded by prism (W={real.world_size})",
                    skip_steps=result["skip_steps"], console=console)
    print_simulation(simulate_run(args.out, "real", result["skip_steps"]), console)
    print_validation(result, console, timing=args.example == args.timing_example)
    if args.timing_example and args.timing_example != args.example:
        console.rule(f"timing: examples/{args.timing_example} (sleep compute: its real run is valid on this host)")
        timed_out = str(Path(args.out).with_name(Path(args.out).name + "-" + args.timing_example))
        timed = validate(str(EXAMPLES / args.timing_example / "job.yaml"), args.ranks, timed_out, slice_size=2,
                         timeout_s=args.timeout, torch_fake=False, replace=replace)
        print_validation(timed, console)
    console.print(f"run directory: {run_dir.root}")
    return 0
