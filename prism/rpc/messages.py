"""Plain-Python forms of the coordinator's messages (no grpc, no generated code)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SCHEMA_VERSION", "TensorMeta", "CommHeader", "FetchError", "dtype_from_name", "dtype_name"]

SCHEMA_VERSION = 1


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r}")
    return dtype


@dataclass(frozen=True, slots=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(dtype_name(t.dtype), tuple(t.shape))

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def size_bytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


@dataclass(frozen=True, kw_only=True, slots=True)
class CommHeader:
    """One comm op of one rank, as the worker hands it in (ranks are global)."""

    rank: int
    op_index: int
    op: str
    group_id: str
    group_ranks: tuple[int, ...]
    seq: int
    reduce_op: str = ""
    root: int = -1
    peer: int = -1
    tag: int = 0
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    flat: bool = False
    coalesced: bool = False
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = field(default=())
    call_site: str = ""

    @property
    def group_rank(self) -> int:
        return self.group_ranks.index(self.rank)


class FetchError(RuntimeError):
    """The coordinator could not produce an op's outputs (the message says why)."""
