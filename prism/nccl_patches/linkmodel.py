"""A lane's latency and bandwidth, and the transfer a collective's algorithm takes over links like it.

A delegated op (docs/gpu.md, docs/emulate.md "What a delegated op's duration leaves out") moves
the sandbox rank's input to the replayer and its output back, one message each way; the real
collective then runs its algorithm's lock-stepped steps among all members (a ring all-reduce of n:
2(n−1) steps of one chunk each) after its last member has arrived. On the CPU lanes path the
replayer holds the outputs for that transfer, estimated from the lane's own link: each step one
message of the step's largest size (:func:`prism.nccl_patches.schedule.critical_path`), each message
``latency + bytes × ns_per_byte``, both measured when the lane opens by a ping-pong between the
replayer (which times it) and the sandbox rank (which echoes).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["LinkModel", "PROBE_LARGE_NUMEL", "PROBE_LARGE_ROUNDS", "PROBE_SMALL_ROUNDS", "probe_echo", "probe_time"]

PROBE_SMALL_ROUNDS = 16
PROBE_LARGE_ROUNDS = 4
PROBE_LARGE_NUMEL = 1 << 14
"""float32 elements of the large probe message (64 KiB)."""


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One message over the link takes ``latency_ns + bytes × ns_per_byte``."""

    latency_ns: float
    ns_per_byte: float

    def message_ns(self, num_bytes: int) -> float:
        return self.latency_ns + num_bytes * self.ns_per_byte if num_bytes > 0 else 0.0

    def path_ns(self, numels: Sequence[int], itemsize: int) -> float:
        """A chain of messages of ``numels`` elements each, one after the other."""
        return sum(self.message_ns(k * itemsize) for k in numels)

    @staticmethod
    def fit(small_rtt_ns: Sequence[float], large_rtt_ns: Sequence[float], large_bytes: int) -> LinkModel:
        """From round trips of a one-element message and of ``large_bytes``: the fastest of each.
        A lane opens while the job starts (imports, W processes connecting); a probe that meets
        that load measures the load, not the link."""
        if not small_rtt_ns or not large_rtt_ns or large_bytes <= 0:
            raise ValueError("a link model needs round trips of both sizes")
        latency = min(small_rtt_ns) / 2
        per_byte = max(0.0, (min(large_rtt_ns) / 2 - latency) / large_bytes)
        return LinkModel(latency, per_byte)


def _rounds():
    yield from ((1, PROBE_SMALL_ROUNDS), (PROBE_LARGE_NUMEL, PROBE_LARGE_ROUNDS))


def probe_echo(pg: dist.ProcessGroup, peer: int, device: torch.device) -> None:
    """The sandbox side of the probe: receive each message and send it back."""
    for numel, rounds in _rounds():
        buf = torch.zeros(numel, device=device)
        for _ in range(rounds):
            pg.recv([buf], peer, 0).wait()
            pg.send([buf], peer, 0).wait()


def probe_time(pg: dist.ProcessGroup, peer: int, device: torch.device) -> LinkModel:
    """The replayer side: send, wait for the echo, time each round trip; the fitted model."""
    rtts: dict[int, list[float]] = {}
    for numel, rounds in _rounds():
        buf = torch.zeros(numel, device=device)
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            pg.send([buf], peer, 0).wait()
            pg.recv([buf], peer, 0).wait()
            rtts.setdefault(numel, []).append(time.perf_counter_ns() - t0)
    return LinkModel.fit(rtts[1], rtts[PROBE_LARGE_NUMEL], PROBE_LARGE_NUMEL * 4)
