"""Pinning a rank's process to a CPU of its own (``PRISM_CPU_AFFINITY=rank``).

On a CPU job the compute of a rank meets whatever else the host runs: W busy processes on a VM
whose vCPUs are hyperthreads share physical cores in whatever placement the scheduler picks, and
the real runs of one job then disagree by more than the emulator's error (bench's
``real_run_spread``). Pinned, rank r runs on the same CPU in the real run, in a calibration slice
and in an emulation: one thread of each physical core first, in order, then the second threads,
so up to one rank per physical core no two ranks share one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["AFFINITY_ENV", "AffinityError", "cpu_order", "pin_rank", "usable_cpus"]

AFFINITY_ENV = "PRISM_CPU_AFFINITY"
MODES = ("none", "rank")

log = logging.getLogger(__name__)


class AffinityError(ValueError):
    """An unknown ``PRISM_CPU_AFFINITY`` setting."""


def _core_of(cpu: int, sys_cpu: Path) -> tuple[int, int]:
    topo = sys_cpu / f"cpu{cpu}" / "topology"
    try:
        return int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text())
    except (OSError, ValueError):
        return (0, cpu)  # no topology: every CPU its own core


def cpu_order(cpus: Iterable[int], sys_cpu: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """``cpus`` with the first thread of every physical core first (cores in order), then the
    second threads, and so on."""
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        by_core.setdefault(_core_of(cpu, sys_cpu), []).append(cpu)
    cores = [by_core[k] for k in sorted(by_core, key=lambda k: by_core[k][0])]
    return [threads[i] for i in range(max(map(len, cores), default=0)) for threads in cores if i < len(threads)]


def pin_rank(rank: int, mode: str | None = None) -> int | None:
    """Pin this process to rank ``rank``'s CPU under ``mode`` (default: ``PRISM_CPU_AFFINITY``);
    the CPU, or None when not pinning."""
    mode = (os.environ.get(AFFINITY_ENV, "none") if mode is None else mode).strip() or "none"
    if mode not in MODES:
        raise AffinityError(f"{AFFINITY_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return None
    order = cpu_order(os.sched_getaffinity(0))
    cpu = order[rank % len(order)]
    os.sched_setaffinity(0, {cpu})
    log.debug("rank %d pinned to CPU %d", rank, cpu)
    return cpu


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or a Slurm step's share,
    not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
