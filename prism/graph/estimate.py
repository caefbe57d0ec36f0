"""Comm durations estimated from historical records (RankLens §IV): nearest neighbours, then a
locally weighted regression.

A comm op is described by a :class:`CommFeatures` — op kind, group size, whether the group
crosses a node boundary, bytes, its position in the step (how many comm ops the rank issued
before it in the same step), the direction of its peer (P2P: the next or the previous rank), the
rank, and whether it is in the first step (start-up waits are not a steady step's).
:class:`DurationEstimator` keeps the samples of the history (recorded graphs) and, for a query,
takes the ``k`` nearest samples of the same op kind, weights them with a tricube kernel of their
distance and fits duration = a + b·bytes by weighted least squares with robustness
iterations (LOWESS; the weighted mean when the neighbours all have the same size). The result is
never negative.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .records import Graph, Node

__all__ = ["CommFeatures", "DurationEstimator", "features_of", "samples_from_graph"]


@dataclass(frozen=True, slots=True)
class CommFeatures:
    kind: str
    """``COLLECTIVE:all_reduce``, ``SEND:send``, ``RECV:recv`` ... (kind and op)."""
    group_size: int
    cross_node: bool
    size_bytes: int
    position: int
    """Comm ops this rank issued before this one in the same step."""
    peer_dir: int
    """P2P: +1 when the peer's rank is higher, -1 when lower; 0 for collectives."""
    rank: int
    first_step: bool = False
    """The op belongs to the run's first step (start-up: ranks arrive at different times)."""


# Weights of the distance terms: an op of another group size, locality or direction is a poor
# neighbour (a penalty larger than any realistic size difference); another rank at the same
# place in the step is nearly as good as the same rank (DP replicas run the same schedule).
_W_GROUP = 4.0
_W_CROSS = 4.0
_W_DIR = 4.0
_W_LOG_BYTES = 1.0
_W_POSITION = 0.5
_W_RANK = 0.25
_W_FIRST = 4.0


def _columns(feats: list[CommFeatures]) -> dict[str, np.ndarray]:
    return {
        "group_size": np.array([f.group_size for f in feats]),
        "cross_node": np.array([f.cross_node for f in feats]),
        "peer_dir": np.array([f.peer_dir for f in feats]),
        "log_bytes": np.log2(np.array([f.size_bytes for f in feats], dtype=np.float64) + 1),
        "position": np.array([f.position for f in feats], dtype=np.float64),
        "rank": np.array([f.rank for f in feats]),
        "first_step": np.array([f.first_step for f in feats]),
        "size_bytes": np.array([f.size_bytes for f in feats], dtype=np.float64),
    }


def _distances(q: CommFeatures, c: dict[str, np.ndarray]) -> np.ndarray:
    """Distance of the query to every sample of its kind (vectorized: a history holds every op of
    every rank of a run)."""
    return (
        _W_GROUP * (c["group_size"] != q.group_size)
        + _W_CROSS * (c["cross_node"] != q.cross_node)
        + _W_DIR * (c["peer_dir"] != q.peer_dir)
        + _W_LOG_BYTES * np.abs(c["log_bytes"] - np.log2(q.size_bytes + 1))
        + _W_POSITION * np.abs(c["position"] - q.position)
        + _W_RANK * (c["rank"] != q.rank)
        + _W_FIRST * (c["first_step"] != q.first_step)
    )


def features_of(node: Node, *, members: tuple[int, ...], ranks_per_node: int, position: int) -> CommFeatures:
    """The features of a recorded comm node (``members``: its group's global ranks)."""
    nodes_spanned = {r // max(1, ranks_per_node) for r in members}
    peer_dir = 0 if node.peer < 0 or node.kind.value == "COLLECTIVE" else (1 if node.peer > node.rank else -1)
    return CommFeatures(
        kind=f"{node.kind.value}:{node.op.value if node.op else ''}",
        group_size=len(members),
        cross_node=len(nodes_spanned) > 1,
        size_bytes=node.size_bytes,
        position=position,
        peer_dir=peer_dir,
        rank=node.rank,
        first_step=node.step <= 0,
    )


def samples_from_graph(graph: Graph, *, ranks_per_node: int,
                       exclude: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[CommFeatures, int]]:
    """(features, duration_ns) of every timed comm node of ``graph`` but the ``(rank, index)`` in
    ``exclude`` (withheld records)."""
    out: list[tuple[CommFeatures, int]] = []
    for rank, nodes in graph.nodes.items():
        position: dict[int, int] = {}
        for n in nodes:
            if not n.is_comm:
                continue
            pos = position.get(n.step, 0)
            position[n.step] = pos + 1
            if n.duration_ns < 0 or (rank, n.index) in exclude:
                continue
            members = graph.groups[n.group_id].ranks if n.group_id in graph.groups else ()
            out.append((features_of(n, members=members, ranks_per_node=ranks_per_node, position=pos), n.duration_ns))
    return out


class DurationEstimator:
    """Duration of a comm op from its ``k`` nearest historical samples of the same kind."""

    def __init__(self, samples: Iterable[tuple[CommFeatures, int]], *, k: int = 8) -> None:
        self.k = k
        by_kind: dict[str, list[tuple[CommFeatures, int]]] = {}
        for feat, duration in samples:
            by_kind.setdefault(feat.kind, []).append((feat, duration))
        self._columns = {kind: _columns([f for f, _ in pool]) for kind, pool in by_kind.items()}
        self._durations = {kind: np.array([d for _, d in pool], dtype=np.float64) for kind, pool in by_kind.items()}

    @property
    def num_samples(self) -> int:
        return sum(len(v) for v in self._durations.values())

    def estimate(self, query: CommFeatures) -> int | None:
        """Estimated duration in ns, or None when the history has no op of this kind."""
        columns = self._columns.get(query.kind)
        if columns is None:
            return None
        dist = _distances(query, columns)
        order = np.argsort(dist, kind="stable")[: self.k]
        d = dist[order]
        y = self._durations[query.kind][order]
        x = columns["size_bytes"][order]
        # Bandwidth just past the farthest neighbour: every neighbour keeps a positive weight.
        h = max(float(d[-1]), 1e-9) * 1.0001
        w = (1.0 - (d / h) ** 3) ** 3
        value = _lowess_at(x - query.size_bytes, y, w)
        return max(0, int(round(value)))


def _lowess_at(dx: np.ndarray, y: np.ndarray, w: np.ndarray, *, iterations: int = 2) -> float:
    """The locally weighted line's value at dx = 0 (the query's size), with Cleveland's robustness
    iterations: a neighbour far off the line (a step that waited on a straggler) is down-weighted by
    the bisquare of its residual. The weighted mean when the neighbours' sizes are all equal."""
    linear = float(np.ptp(dx)) > 0 and len(dx) >= 3
    robust = np.ones_like(w)
    value = float(np.average(y, weights=w))
    for _ in range(iterations + 1):
        ww = w * robust
        if ww.sum() <= 0:
            break
        if linear:
            a = np.stack([np.ones_like(dx), dx], axis=1)
            sw = np.sqrt(ww)
            coef, *_ = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)
            fitted, value = a @ coef, float(coef[0])
        else:
            value = float(np.average(y, weights=ww))
            fitted = np.full_like(y, value)
        residual = y - fitted
        scale = 6.0 * float(np.median(np.abs(residual)))
        if scale <= 0:
            break
        robust = np.clip(1.0 - (residual / scale) ** 2, 0.0, None) ** 2
    if value < 0:  # a line extrapolated below zero: the neighbours' mean is the better guess
        value = float(np.average(y, weights=w))
    return value
