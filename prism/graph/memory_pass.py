"""Timed runs without the per-op CPU memory tracker; tracked peaks from a separate memory pass.

On CPU the tracked peak (``prism.sandbox.memtrack``) runs Python for every aten op (~5 µs each,
``bench/memtrack_cost.py``), which would slow the steps that ``prism record`` and ``prism
emulate`` time. Both therefore run the job twice when the peaks come from that tracker: a *memory
pass* (tracked, not timed) and a *timed pass* (``PRISM_MEMORY=rss``: no dispatch mode). The timed
pass's record keeps its nodes, step times and losses and takes the memory pass's peaks. Workers see
which pass they are in as ``PRISM_RECORD_PASS`` (``memory`` or ``timed``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from prism.core.config import JobConfig

from .records import RankRecord

__all__ = ["PASS_ENV", "SEPARATE_PASS", "TRACKED_INLINE", "needs_memory_pass", "memory_pass_job", "timed_pass_job",
           "timed_with_tracker", "with_tracked_peaks"]

PASS_ENV = "PRISM_RECORD_PASS"

SEPARATE_PASS = "separate tracked pass"
TRACKED_INLINE = "tracked inline"
"""``graph.meta["memory"]`` of a recorded CPU run: its peaks came from a memory pass and its steps
were timed without the tracker, or its steps were timed with the tracker running in every op
(``prism record --no-memory-pass``; ``python -m prism.record``, one run, unless ``PRISM_MEMORY=rss``)."""

log = logging.getLogger(__name__)


def needs_memory_pass(job: JobConfig) -> bool:
    """Whether ``job``'s peaks come from the per-op CPU tracker (which would slow a timed run)."""
    mode = job.env.get("PRISM_MEMORY", os.environ.get("PRISM_MEMORY", "tracked"))
    return job.device == "cpu" and mode == "tracked"


def timed_with_tracker(meta: Mapping[str, str]) -> bool:
    """Whether a recorded run's steps include the tracker's cost per op: calibration slices run
    without it, so a comparison of their times with this run's reads that cost as an error
    (fsdp2 at W=4 on 16 cores: 219 ms per step tracked against 178-181 untracked)."""
    return meta.get("memory") == TRACKED_INLINE


def memory_pass_job(job: JobConfig) -> JobConfig:
    return dataclasses.replace(job, env={**job.env, PASS_ENV: "memory"})


def timed_pass_job(job: JobConfig) -> JobConfig:
    """``job`` without the tracker; its memory cap is the memory pass's to enforce (RSS cannot)."""
    return dataclasses.replace(job, memory_cap_bytes=0, env={**job.env, "PRISM_MEMORY": "rss", PASS_ENV: "timed"})


def with_tracked_peaks(timed: RankRecord, tracked: RankRecord) -> RankRecord:
    """The timed pass's record with the memory pass's peaks."""
    if timed.rank != tracked.rank:
        raise AssertionError(f"memory pass rank {tracked.rank} paired with timed rank {timed.rank}")
    n_timed = sum(n.is_comm for n in timed.nodes)
    n_tracked = sum(n.is_comm for n in tracked.nodes)
    if n_timed != n_tracked:
        log.warning("rank %d issued %d comm ops in the timed pass but %d in the memory pass: the program is not "
                    "deterministic, and its peaks are the memory pass's", timed.rank, n_timed, n_tracked)
    s = tracked.summary
    summary = dataclasses.replace(timed.summary, peak_memory_bytes=s.peak_memory_bytes,
                                  measured_peak_memory_bytes=s.measured_peak_memory_bytes,
                                  memory_source=s.memory_source)
    return dataclasses.replace(timed, summary=summary)
