"""The device-layout options shared by the commands that run sandbox ranks on GPUs."""

from __future__ import annotations

import argparse

from prism.core.layout import DEVICE_PATHS


def _gpus(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1, got {text!r}") from None


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPU layout (device: cuda jobs)")
    g.add_argument("--device-path", choices=DEVICE_PATHS, default="auto",
                   help="nccl: sandbox ranks on sandbox GPUs, replayers on assistant GPUs, device-to-device "
                        "over NCCL; ipc: a replayer shares a sandbox rank's GPU, device memory over CUDA IPC "
                        "(e.g. one GPU, one sandbox rank); host: gloo with host staging (two sandbox ranks "
                        "on one GPU); auto (default): nccl when each sandbox rank and each replayer can have "
                        "a GPU of its own, else ipc when each sandbox rank can, else host")
    g.add_argument("--sandbox-gpus", type=_gpus, default=(), metavar="LIST",
                   help="GPUs of the sandbox ranks, e.g. 0,1 (default: all but the last --replayers GPUs)")
    g.add_argument("--assistant-gpus", type=_gpus, default=(), metavar="LIST",
                   help="GPUs of the replayers (default: the last --replayers GPUs)")
    g.add_argument("--mps", action="store_true",
                   help="run the sandbox ranks and replayers under a private CUDA MPS server: processes that "
                        "share a GPU (the ipc path) run their kernels side by side instead of time-sliced "
                        "(one H200, DDP 805 MB: 260 ms per step time-sliced, 112 ms under MPS, 99 ms real on 2 GPUs)")


def device_options(args: argparse.Namespace) -> dict:
    """The EmulateOptions fields of the options above."""
    return {"device_path": args.device_path, "sandbox_gpus": args.sandbox_gpus,
            "assistant_gpus": args.assistant_gpus, "mps": args.mps}
