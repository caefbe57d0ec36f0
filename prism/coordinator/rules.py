"""User-defined communication inputs (paper §5.2, appendix C): rules and hooks that decide an op's
outputs without the other ranks, so every rank runs on its own.

With ``comm_inputs.source: rules`` every comm op of a rank is decided here, from the op's
description and this rank's own inputs, the moment it is submitted:

1. the user's ``comm_inputs.rules``, first match wins; a rule's action is a ``value`` (a number
   or a nested list broadcast to each output), a ``fill`` (``mirror``/``zeros``/``ones``, or
   ``exact``: the CPU executor computes the real output once every member has arrived) or a
   ``hook`` (``file.py:function`` or ``package.module:function``, called as
   ``hook(op: CommOpInfo, inputs: list[Tensor])`` and returning the output tensor, a list of them,
   or None for the filler);
2. the built-in control-flow rule (``comm_inputs.control_flow: exact``): integer and bool ops of at
   most ``values.small_max_bytes`` per rank — split sizes, token ids, status and NaN flags,
   ``broadcast_object_list`` — are exact;
3. everything else gets ``comm_inputs.filler``.

``mirror`` is what the op would return if every member had handed in this rank's inputs:
all-reduce ``sum`` n·x, ``avg``/``min``/``max`` x, ``product`` x^n; all-gather n copies;
reduce-scatter this rank's chunk, scaled like the all-reduce; all-to-all this rank's own input;
a broadcast, and a scatter to a non-root, leave the buffer as it is; a recv is ones (a received
flag reads "yes", a pipeline's shape vote passes).

With DP templates (``templates: dp``) the same rules decide ops whose group spans DP replicas
that do not run, whatever the source; ``exact`` is impossible there and falls back to the filler.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from prism.core.config import CONTROL_FLOW_DTYPES, CommInputs, CommRule, normalize_dtype
from prism.core.errors import ConfigError, PrismError
from prism.core.ranks import parse_rank_ranges
from prism.rpc import CommHeader, TensorMeta

__all__ = ["CommOpInfo", "RuleSet", "EXACT", "fill_outputs", "load_hook"]

log = logging.getLogger(__name__)


class _Exact:
    def __repr__(self) -> str:
        return "EXACT"


EXACT = _Exact()
"""Returned by :meth:`RuleSet.decide` when the op must be executed over all its members."""


@dataclass(frozen=True, slots=True)
class CommOpInfo:
    """What a rule hook is told about one comm op of one rank (ranks are global)."""

    kind: str
    """all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, barrier, recv."""
    rank: int
    world_size: int
    group_ranks: tuple[int, ...]
    group_rank: int
    seq: int
    """The op's sequence number in its group (collectives) or per (src, dst, group) pair (recv)."""
    index: int
    """This rank's n-th comm op (0-based)."""
    reduce_op: str
    root: int
    """Global root of broadcast/reduce/gather/scatter; -1 otherwise."""
    peer: int
    """Global rank of the sender of a recv; -1 otherwise."""
    in_splits: tuple[int, ...]
    out_splits: tuple[int, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype
    call_site: str
    """``file.py:line`` of the script's call."""
    group_id: str

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the (first) output."""
        return self.output_shapes[0] if self.output_shapes else ()

    @staticmethod
    def of(h: CommHeader, world_size: int) -> CommOpInfo:
        metas = h.outputs or h.inputs
        return CommOpInfo(
            kind=h.op, rank=h.rank, world_size=world_size, group_ranks=h.group_ranks, group_rank=h.group_rank,
            seq=h.seq, index=h.op_index, reduce_op=h.reduce_op, root=h.root, peer=h.peer, in_splits=h.in_splits,
            out_splits=h.out_splits, input_shapes=tuple(m.shape for m in h.inputs),
            output_shapes=tuple(m.shape for m in h.outputs),
            dtype=metas[0].torch_dtype if metas else torch.float32, call_site=h.call_site, group_id=h.group_id,
        )


def _out_dtype(h: CommHeader) -> str:
    metas = h.outputs or h.inputs
    return metas[0].dtype if metas else ""


def _out_bytes(h: CommHeader) -> int:
    return sum(m.size_bytes for m in h.outputs)


# --- fillers --------------------------------------------------------------------------------------


def _scaled(x: torch.Tensor, reduce_op: str, n: int) -> torch.Tensor:
    """The reduction of n copies of x."""
    if reduce_op == "sum":
        return x * n if x.dtype != torch.bool else x.clone()
    if reduce_op == "product":
        return x**n if x.dtype != torch.bool else x.clone()
    if reduce_op == "bxor":
        return x.clone() if n % 2 else torch.zeros_like(x)
    return x.clone()  # avg, min, max, band, bor


def _mirror(h: CommHeader, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    n, me, op = len(h.group_ranks), h.group_rank, h.op
    if op in ("barrier", "broadcast"):
        return []  # a broadcast: the root's buffer is what every member would hold
    if op == "recv":
        return [torch.ones(m.shape, dtype=m.torch_dtype) for m in h.outputs]
    if op == "all_reduce":
        return [_scaled(x, h.reduce_op, n) for x in inputs]
    if op == "reduce":
        return [_scaled(x, h.reduce_op, n) for x in inputs] if h.rank == h.root else []
    if op == "all_gather":
        if h.flat or h.coalesced:
            return [x.reshape(1, -1).expand(n, -1).reshape(m.shape).clone() for x, m in zip(inputs, h.outputs,
                                                                                          strict=True)]
        return [inputs[0].clone() for _ in h.outputs]
    if op == "reduce_scatter":
        if h.flat or h.coalesced:
            return [_scaled(x.reshape(n, -1)[me].reshape(m.shape), h.reduce_op, n)
                    for x, m in zip(inputs, h.outputs, strict=True)]
        return [_scaled(inputs[me], h.reduce_op, n)]
    if op == "all_to_all":
        return [x.clone() if tuple(x.shape) == m.shape else torch.zeros(m.shape, dtype=m.torch_dtype)
                for x, m in zip(inputs, h.outputs, strict=True)]
    if op == "gather":
        return [inputs[0].clone() for _ in h.outputs] if h.rank == h.root else []
    if op == "scatter":
        return [inputs[me].clone()] if h.rank == h.root else []
    raise AssertionError(f"no filler for op {op!r}")


def fill_outputs(kind: str, h: CommHeader, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of ``h`` under filler ``kind`` (mirror, zeros, ones)."""
    if kind == "mirror":
        return _mirror(h, inputs)
    if h.op == "barrier":
        return []
    make = torch.zeros if kind == "zeros" else torch.ones
    return [make(m.shape, dtype=m.torch_dtype) for m in h.outputs]


# --- hooks ----------------------------------------------------------------------------------------


def load_hook(spec: str, base_dir: str | Path, key: str) -> Callable:
    """Import ``file.py:function`` (relative to ``base_dir``) or ``package.module:function``."""
    where, _, name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            path = (Path(base_dir) / where).resolve()
            module_name = f"prism_rules_{abs(hash(str(path)))}"
            module = sys.modules.get(module_name)
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(module_name, path)
                if loader_spec is None or loader_spec.loader is None:
                    raise ImportError(f"cannot load {path}")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[module_name] = module
                loader_spec.loader.exec_module(module)
        else:
            sys.path.insert(0, str(base_dir))
            try:
                module = importlib.import_module(where)
            finally:
                sys.path.remove(str(base_dir))
    except Exception as e:  # noqa: BLE001 - the user's module: show what went wrong
        raise ConfigError(key, f"cannot import {where}: {type(e).__name__}: {e}") from e
    func = getattr(module, name, None)
    if not callable(func):
        raise ConfigError(key, f"{where} has no function {name!r}")
    return func


# --- the rule set ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Compiled:
    index: int
    rule: CommRule
    dtypes: frozenset[str]
    ranks: frozenset[int]
    hook: Callable | None

    @property
    def key(self) -> str:
        return f"comm_inputs.rules[{self.index}]"

    def matches(self, h: CommHeader) -> bool:
        r = self.rule
        return ((not r.op or h.op in r.op)
                and (not r.call_site or fnmatch.fnmatchcase(h.call_site, r.call_site))
                and (not self.dtypes or _out_dtype(h) in self.dtypes)
                and (not r.group_size or len(h.group_ranks) == r.group_size)
                and (r.max_bytes < 0 or _out_bytes(h) <= r.max_bytes)
                and (not self.ranks or h.rank in self.ranks))


class RuleSet:
    """``comm_inputs`` compiled: hooks imported (a bad one is a ConfigError naming its key)."""

    def __init__(self, comm_inputs: CommInputs, *, base_dir: str | Path, world_size: int,
                 small_max_bytes: int) -> None:
        self.world_size = world_size
        self.filler = comm_inputs.filler
        self.control_flow_exact = comm_inputs.control_flow == "exact"
        self.small_max_bytes = small_max_bytes
        self._rules = []
        for i, rule in enumerate(comm_inputs.rules):
            hook = load_hook(rule.hook, base_dir, f"comm_inputs.rules[{i}].hook") if rule.hook else None
            self._rules.append(_Compiled(
                i, rule, frozenset(normalize_dtype(d) or d for d in rule.dtype),
                frozenset(parse_rank_ranges(rule.ranks, world_size)) if rule.ranks else frozenset(), hook))
        self.num_applied = [0] * len(self._rules)

    def decide(self, h: CommHeader, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | _Exact:
        """This rank's outputs of ``h`` (tensors for its output buffers; [] leaves them), or EXACT."""
        if h.op == "barrier":
            return []
        for c in self._rules:
            if c.matches(h):
                self.num_applied[c.index] += 1
                return self._apply(c, h, inputs)
        if (self.control_flow_exact and _out_dtype(h) in CONTROL_FLOW_DTYPES
                and _out_bytes(h) <= self.small_max_bytes):
            return EXACT
        return self.fill(h, inputs)

    def fill(self, h: CommHeader, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return fill_outputs(self.filler, h, inputs)

    def _apply(self, c: _Compiled, h: CommHeader, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | _Exact:
        r = c.rule
        if r.fill == "exact":
            return EXACT
        if r.fill:
            return fill_outputs(r.fill, h, inputs)
        if c.hook is not None:
            try:
                got = c.hook(CommOpInfo.of(h, self.world_size), [t.clone() for t in inputs])
            except Exception as e:
                raise PrismError(f"{c.key}.hook {r.hook} raised on rank {h.rank} {_where(h)}: "
                                 f"{type(e).__name__}: {e}") from e
            if got is None:
                return self.fill(h, inputs)
            values = [got] if isinstance(got, torch.Tensor) else list(got)
            return _fit(values, h.outputs, f"{c.key}.hook {r.hook} on rank {h.rank} {_where(h)}")
        return _fit([torch.as_tensor(r.value)] * len(h.outputs), h.outputs, f"{c.key}.value on rank {h.rank} "
                    f"{_where(h)}", broadcast=True)


def _where(h: CommHeader) -> str:
    return f"{h.op} {h.group_id}:{h.seq} at {h.call_site or '?'}"


def _fit(values: list, metas: Sequence[TensorMeta], what: str, *, broadcast: bool = False) -> list[torch.Tensor]:
    if len(values) != len(metas):
        raise PrismError(f"{what}: returned {len(values)} tensors, the op has {len(metas)} outputs "
                         f"{[m.shape for m in metas]}")
    out = []
    for v, m in zip(values, metas, strict=True):
        if not isinstance(v, torch.Tensor):
            raise PrismError(f"{what}: returned {type(v).__name__}, expected a tensor")
        v = v.detach().to("cpu", m.torch_dtype)
        try:
            if broadcast:
                v = torch.broadcast_to(v, m.shape)
            elif v.numel() == m.numel:
                v = v.reshape(m.shape)
            else:
                raise RuntimeError(f"{v.numel()} elements")
            v = torch.empty(m.shape, dtype=m.torch_dtype).copy_(v)  # dense, own storage
        except RuntimeError as e:
            raise PrismError(f"{what}: a value of shape {tuple(v.shape)} does not fit the output {m.shape} "
                             f"({e})") from e
        out.append(v)
    return out
