"""safetensors files read with plain reads, not through a mapping of the file.

``safe_open`` and ``load_file`` map the file. A process that loads one file per op while a
training script runs beside it (an emulated rank's recorded data, a replayed rank's payloads)
would then fault each file's pages in and unmap them when done, and an unmapping stops every
core that ran one of the process's threads for a TLB flush: costs that no real rank pays
(docs/emulate.md). Each tensor here is read into memory of its own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["read_safetensors"]

_DTYPES = {name: getattr(torch, attr) for name, attr in (
    ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"), ("I64", "int64"),
    ("I32", "int32"), ("I16", "int16"), ("I8", "int8"), ("U8", "uint8"), ("BOOL", "bool"), ("C64", "complex64"),
    ("U64", "uint64"), ("U32", "uint32"), ("U16", "uint16"), ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2", "float8_e5m2"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
) if hasattr(torch, attr)}
"""safetensors' dtype names."""


def read_safetensors(path: str | os.PathLike[str], select: Callable[[str], bool] | None = None,
                     ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The file's tensors (those whose name ``select`` accepts, when given: the others are not
    read) and metadata. Raises FileNotFoundError, other OSErrors, and ValueError (or KeyError,
    TypeError) on a file that is not a whole safetensors file."""
    with Path(path).open("rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("no header")
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            raise ValueError("header cut")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None) or {}
        tensors = {}
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = _DTYPES[info["dtype"]]
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(x) for x in info["shape"]]
            if not 0 <= begin <= end <= size - 8 - n or end - begin != math.prod(shape) * dtype.itemsize:
                raise ValueError(f"tensor {name} has offsets {begin}..{end} for {info['dtype']} {shape}")
            if select is not None and not select(name):
                continue
            raw = torch.empty(end - begin, dtype=torch.uint8)
            if raw.numel():
                f.seek(8 + n + begin)
                if f.readinto(memoryview(raw.numpy())) != raw.numel():
                    raise ValueError(f"tensor {name} is cut")
            tensors[name] = raw.view(dtype).reshape(shape)
    return tensors, meta
