"""Sizes as users write them: ``600000``, ``640KiB``, ``1.5GiB``, ``2GB``."""

from __future__ import annotations

import re

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "tb": 1000**4}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes of ``text`` (binary units KiB/MiB/GiB/TiB, decimal kB/MB/GB/TB); ValueError otherwise."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 600000, 640KiB, 1.5GiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def format_bytes(n: int) -> str:
    """``n`` bytes exactly, with a binary-unit reading beside it: ``688128 B (672.0 KiB)``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n} B ({n / size:.1f} {unit})"
    return f"{n} B"
