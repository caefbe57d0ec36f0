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
                        "over NCCL; host: gloo with host staging (one GPU for all); auto (default): nccl "
                        "when each sandbox rank and each replayer can have a GPU of its own")
    g.add_argument("--sandbox-gpus", type=_gpus, default=(), metavar="LIST",
                   help="GPUs of the sandbox ranks, e.g. 0,1 (default: all but the last --replayers GPUs)")
    g.add_argument("--assistant-gpus", type=_gpus, default=(), metavar="LIST",
                   help="GPUs of the replayers (default: the last --replayers GPUs)")


def device_options(args: argparse.Namespace) -> dict:
    """The EmulateOptions fields of the options above."""
    return {"device_path": args.device_path, "sandbox_gpus": args.sandbox_gpus,
            "assistant_gpus": args.assistant_gpus}
