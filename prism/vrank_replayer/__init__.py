"""The vrank replayer: hosts the virtual ranks of an emulation (docs/virtual-ranks.md).

:func:`emulate` starts the sandbox ranks (the real script, ``live`` engine) and the replayers
that answer for every other rank; :func:`capture_job` makes recorded data without ``prism collect``.
"""

from .clock import AsapClock, Clock, TimedClock
from .launch import EmulateOptions, EmulateResult, ReplayerResult, SandboxRankResult, capture_job, captured_losses, emulate, with_steps
from .plan import Channel, plan_channels
from .replayer import Replayer, ReplayerSpec

__all__ = [
    "AsapClock",
    "Channel",
    "Clock",
    "EmulateOptions",
    "EmulateResult",
    "Replayer",
    "ReplayerResult",
    "ReplayerSpec",
    "SandboxRankResult",
    "TimedClock",
    "capture_job",
    "captured_losses",
    "emulate",
    "plan_channels",
    "with_steps",
]
