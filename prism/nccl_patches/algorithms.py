"""Which algorithm prism runs for an all-reduce: ring (the default) or tree, chosen the way a user
chooses it for NCCL — with ``NCCL_ALGO`` in the job's ``env``.

prism models two all-reduce algorithms (docs/pruned-collectives.md): a ring (reduce-scatter then
all-gather) and a binary tree (reduce up, broadcast down; the paper's appendix D). The collector
reduces in the chosen algorithm's order and the emulator's pruned algorithm follows the same
schedule, so sandbox ranks receive the collected values bit for bit under either.

NCCL's syntax is accepted (NCCL ≥ 2.24): a comma-separated list of algorithms, ``^`` in front to
exclude the listed ones, optionally per collective, ``allreduce:tree;allgather:ring``. prism runs
the tree for all-reduce when the allowed set for all-reduce contains ``tree`` and not ``ring``
(``NCCL_ALGO=Tree``, ``allreduce:tree``, ``^ring``); otherwise a ring — when NCCL may choose
between both, its tuner decides by message size and topology, which prism does not model. Other
collectives always use prism's single algorithm for them (ring, chain broadcast, direct all-to-all).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prism.core.errors import ConfigError

__all__ = ["AlgorithmPolicy", "NCCL_ALGORITHMS", "policy_from_env"]

NCCL_ALGORITHMS = ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
_FUNCTIONS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv")
_KEY = "env.NCCL_ALGO"


@dataclass(frozen=True, slots=True)
class AlgorithmPolicy:
    tree_all_reduce: bool = False
    """All-reduce runs as a binary tree (else a ring)."""

    @property
    def all_reduce(self) -> str:
        return "tree" if self.tree_all_reduce else "ring"


def _allowed(spec: str) -> frozenset[str]:
    spec = spec.strip()
    exclude = spec.startswith("^")
    names = [n.strip().lower() for n in spec.lstrip("^").split(",") if n.strip()]
    unknown = [n for n in names if n not in NCCL_ALGORITHMS]
    if unknown or not names:
        raise ConfigError(_KEY, f"unknown algorithm {', '.join(unknown) or repr(spec)} "
                                f"(NCCL knows: {', '.join(NCCL_ALGORITHMS)})")
    return frozenset(NCCL_ALGORITHMS) - set(names) if exclude else frozenset(names)


def _all_reduce_spec(value: str) -> str | None:
    """The part of ``NCCL_ALGO`` that applies to all-reduce (None: no restriction)."""
    if ":" not in value:
        return value
    found = None
    for segment in value.split(";"):
        if not segment.strip():
            continue
        func, sep, algos = segment.partition(":")
        func = func.strip().lower()
        if not sep or func not in _FUNCTIONS:
            raise ConfigError(_KEY, f"{segment.strip()!r}: expected <collective>:<algorithms> with a collective "
                                    f"among {', '.join(_FUNCTIONS)}")
        if func == "allreduce":
            found = algos
    return found


def policy_from_env(env: Mapping[str, str]) -> AlgorithmPolicy:
    """The policy a job's environment asks for (see the module docstring)."""
    value = env.get("NCCL_ALGO", "").strip()
    if not value:
        return AlgorithmPolicy()
    spec = _all_reduce_spec(value)
    if spec is None:
        return AlgorithmPolicy()
    allowed = _allowed(spec)
    return AlgorithmPolicy(tree_all_reduce="tree" in allowed and "ring" not in allowed)
