"""When a virtual rank issues an op: the replayer asks its clock before it plays a vrank's part.

The emulate issue's timed co-simulation plugs in here: a clock that advances each vrank through
the timed graph (compute nodes take their recorded durations) and returns from
:meth:`Clock.wait_until_issue` once the vrank's simulated issue time has passed.
"""

from __future__ import annotations

from typing import Protocol

from prism.graph.records import Node

__all__ = ["Clock", "AsapClock"]


class Clock(Protocol):
    def wait_until_issue(self, vrank: int, node: Node) -> None:
        """Block until virtual rank ``vrank`` issues the op ``node`` identifies (its group and
        sequence, or its message identity; the node is the one the graph records for a sandbox
        member of the op: identities are shared by all members)."""

    def on_complete(self, vrank: int, node: Node) -> None:
        """The vrank's part of ``node`` is done (transfers with the sandbox finished)."""


class AsapClock:
    """Bare-graph replay (calibration slices, value-only emulation): a vrank issues its next op
    as soon as the sandbox side is ready for it."""

    def wait_until_issue(self, vrank: int, node: Node) -> None:
        return None

    def on_complete(self, vrank: int, node: Node) -> None:
        return None
