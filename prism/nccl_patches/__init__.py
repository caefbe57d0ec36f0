"""Pruned collective algorithms with compensated chunks, and the physical transport they use.

See docs/pruned-collectives.md. The ``live`` comm engine (sandbox side) calls
:func:`run_sandbox_side`; the vrank replayer calls :func:`run_neighbor_side` with a
:class:`RecordedCollective` that the collector built with :func:`record_for_sandbox`.
"""

from .compensation import DEVIATION_OPS, RecordedCollective, algo_for, record_for_sandbox
from .pruned import (
    NeighborResult,
    SandboxResult,
    neighbor_ranks,
    pruned_steps,
    run_in_process,
    run_neighbor_side,
    run_sandbox_side,
)
from .schedule import Algo, Geometry, LinkTraffic, Step, full_schedule, link_traffic, steps_touching
from .transport import Transport

__all__ = [
    "Algo",
    "DEVIATION_OPS",
    "Geometry",
    "LinkTraffic",
    "NeighborResult",
    "RecordedCollective",
    "SandboxResult",
    "Step",
    "Transport",
    "algo_for",
    "full_schedule",
    "link_traffic",
    "neighbor_ranks",
    "pruned_steps",
    "record_for_sandbox",
    "run_in_process",
    "run_neighbor_side",
    "run_sandbox_side",
    "steps_touching",
]
