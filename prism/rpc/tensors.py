"""Tensors to byte chunks and back (chunks of at most ``MAX_CHUNK_BYTES``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from .messages import TensorMeta

__all__ = ["MAX_CHUNK_BYTES", "tensor_chunks", "tensors_from_bytes"]

MAX_CHUNK_BYTES = 1 << 20


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def tensor_chunks(tensors: Sequence[torch.Tensor], chunk_bytes: int = MAX_CHUNK_BYTES) -> Iterator[bytes]:
    """The tensors' bytes, concatenated in order, cut into chunks of at most ``chunk_bytes``."""
    pending = bytearray()
    for t in tensors:
        raw = _raw(t)
        pos = 0
        while pos < len(raw):
            take = min(chunk_bytes - len(pending), len(raw) - pos)
            pending += raw[pos : pos + take]
            pos += take
            if len(pending) == chunk_bytes:
                yield bytes(pending)
                pending.clear()
    if pending:
        yield bytes(pending)


def tensors_from_bytes(metas: Sequence[TensorMeta], chunks: Iterable[bytes]) -> list[torch.Tensor]:
    """Rebuild tensors described by ``metas`` from their concatenated bytes."""
    data = bytearray()
    for c in chunks:
        data += c
    want = sum(m.size_bytes for m in metas)
    if len(data) != want:
        raise ValueError(f"tensor payload has {len(data)} bytes, the metadata describes {want}")
    out, pos = [], 0
    buf = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    for m in metas:
        n = m.size_bytes
        out.append(buf[pos : pos + n].clone().view(m.torch_dtype).reshape(m.shape))
        pos += n
    return out
