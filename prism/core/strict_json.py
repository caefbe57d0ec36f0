"""JSON that every reader accepts: a figure that could not be measured (NaN, or an infinite ratio)
is written as null.

Python's ``json`` writes them as the bare words ``NaN`` and ``Infinity``, which are not JSON: jq,
browsers and most other readers refuse the whole file."""

from __future__ import annotations

import json
import math

__all__ = ["nonfinite_as_null", "dumps_strict"]


def nonfinite_as_null(value):
    """``value`` with every NaN and infinity as None (JSON null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: nonfinite_as_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nonfinite_as_null(v) for v in value]
    return value


def dumps_strict(value, *, indent: int | None = None) -> str:
    """``value`` as standard JSON, non-finite figures as null."""
    return json.dumps(nonfinite_as_null(value), indent=indent, allow_nan=False)
