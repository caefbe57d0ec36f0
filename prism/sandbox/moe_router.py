"""The MoE mock router (PrismLLM appendix F; job file key ``moe_router``, docs/moe-router.md).

Installed in every rank worker when the job names one (``prism.core.config.MOE_ROUTER_ENV``). The
gate is the submodule ``attr.path`` of every module of class ``Class`` (``gate: Class.attr.path``):
a global forward pre-hook notes the gates as their parents run, a global forward hook overwrites
each gate call's output — the ``[tokens, experts]`` logits — **in place** with precomputed logits,
so the script's own top-k routing sends the tokens where the balance-ratio plan says. No new
tensor reaches the program: the precomputed table is made once, outside the tracked memory (on
CUDA in pinned host memory, copied asynchronously), and copied into the gate's output.

The plan, identical on every rank of an EP group (no communication): the requested statistics are
fitted once by ``ep`` ratios (:func:`prism.core.balance.fit_ratios`); gating call ``c`` gives them
to the group's ranks in a permutation drawn from ``(seed, group, c)``, turns them into tokens per
rank and a source × destination token matrix; this rank's tokens go, in order, to the experts of
each destination (round-robin among its ``experts_per_rank``). Each rank writes what it sent per
call to ``<out>/rank-R.moe_router.json``.
"""

from __future__ import annotations

import json
import logging
import weakref
from pathlib import Path

import numpy as np
import torch

from prism.core.atomic import atomic_write_text
from prism.core.balance import fit_ratios, shares, token_matrix

from .memtrack import untracked

__all__ = ["MockRouter", "install_router", "router_log_path"]

log = logging.getLogger(__name__)

_HIGH = 8.0
"""The chosen expert's logit (others 0): softmax gives it 0.9+ of the probability at 8 experts."""
_TABLE_CALLS = 32
"""Gating calls precomputed at once; the plan goes on cyclically (a long run repeats it)."""


def router_log_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank:05d}.moe_router.json"


class MockRouter:
    def __init__(self, config: dict, *, rank: int, out_dir: str, current_step=lambda: -1) -> None:
        self.cls_name, _, self.path = config["gate"].partition(".")
        self.ep = int(config["ep"])
        self.experts_per_rank = int(config.get("experts_per_rank", 0))
        self.seed = int(config.get("seed", 0))
        self.target = dict(config["br"])
        self.rank = rank
        self.group, self.group_rank = divmod(rank, self.ep)
        self.out_dir = out_dir
        self.current_step = current_step
        self.ratios = fit_ratios(self.target, self.ep)
        self._gates: weakref.WeakSet = weakref.WeakSet()
        self._table: torch.Tensor | None = None
        self._epr = 1
        self._calls = 0
        self.log: list[dict] = []
        self._handles = []

    def install(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._note_gates),
                         hooks.register_module_forward_hook(self._overwrite)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _note_gates(self, module, _inputs) -> None:
        if type(module).__name__ == self.cls_name:
            gate = module
            for part in self.path.split("."):
                gate = getattr(gate, part)
            self._gates.add(gate)

    def plan(self, call: int, tokens: int) -> list[list[int]]:
        """The group's token matrix of gating call ``call`` (``m[source][dest]``, group ranks)."""
        rng = np.random.default_rng([self.seed, self.group, call])
        ratios = self.ratios[rng.permutation(self.ep)]
        return token_matrix(shares(ratios, tokens), tokens)

    def _build(self, like: torch.Tensor) -> None:
        experts = like.shape[-1]
        tokens = like.numel() // experts
        epr = self.experts_per_rank or experts // self.ep
        if epr * self.ep > experts:
            raise ValueError(f"moe_router: the gate {self.cls_name}.{self.path} gives {experts} logits per token, "
                             f"fewer than ep {self.ep} × experts_per_rank {epr}")
        with untracked():
            table = torch.zeros((_TABLE_CALLS, tokens, experts), dtype=like.dtype,
                                pin_memory=like.is_cuda)
        self._epr = epr
        for c in range(_TABLE_CALLS):
            row = self.plan(c, tokens)[self.group_rank]
            t = 0
            for dest, n in enumerate(row):
                for k in range(n):
                    table[c, t, dest * epr + k % epr] = _HIGH
                    t += 1
        self._table = table

    def _overwrite(self, module, _inputs, output):
        if module not in self._gates or not isinstance(output, torch.Tensor):
            return None
        experts = output.shape[-1]
        if self._table is None or self._table.shape[1:] != (output.numel() // experts, experts):
            self._build(output)
        c = self._calls % _TABLE_CALLS
        logits = output.view(-1, experts)
        with torch.no_grad():
            logits.copy_(self._table[c], non_blocking=True)
            with untracked():  # what this rank's top-1 now sends to each rank of its EP group
                dest = torch.div(logits.argmax(-1), self._epr, rounding_mode="floor")
                sent = torch.bincount(dest, minlength=self.ep)[: self.ep].tolist()
        self.log.append({"call": self._calls, "step": self.current_step(), "sent": sent})
        self._calls += 1
        atomic_write_text(router_log_path(self.out_dir, self.rank), json.dumps(
            {"rank": self.rank, "ep": self.ep, "group": self.group, "group_rank": self.group_rank,
             "target": self.target, "calls": self.log}))
        return None


def install_router(config_json: str, *, rank: int, out_dir: str, current_step) -> MockRouter:
    router = MockRouter(json.loads(config_json), rank=rank, out_dir=out_dir, current_step=current_step)
    router.install()
    log.info("rank %d: MoE mock router on %s, EP group %d", rank, json.loads(config_json)["gate"], router.group)
    return router
