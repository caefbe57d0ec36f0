"""How fast this host runs a fixed piece of work now, so a timing run can say when its host moved.

A calibration and the emulations that follow it compare times taken minutes apart. On a host whose
CPU speed drifts (the 16-vCPU device machines: a vCPU's speed moves by 20–40 % within a second,
docs/emulate.md), the same real job has taken 109 ms and 147 ms per step within 15 minutes, and the
calibrated error of one job moved by 25 points between two calls on the same code. Nothing in the
emulation can tell such a drift from its own error unless the host is timed beside it.

:func:`probe_ms` times a fixed single-threaded float32 matrix product (the median of 5 takes of
20 products of 256×256, ~5–8 ms a take); :func:`spread` is how far apart a set of probes lie. The
calibration probes before and after every slice (``meta["host_probe_ms"]`` of the timed graph) and
an emulation before it starts, so both reports can say by how much the host moved.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

__all__ = ["DRIFT_WARN", "probe_ms", "spread", "parse_probes", "format_probes"]

DRIFT_WARN = 0.10
"""Above this spread the reports warn: the timing figures may have moved with the host."""
_TAKES, _PRODUCTS, _SIZE = 5, 20, 256


def probe_ms() -> float:
    """Milliseconds for 20 single-threaded 256×256 float32 products now (median of 5 takes)."""
    import torch  # noqa: PLC0415 - the roles that time a host have it loaded already

    a = torch.randn(_SIZE, _SIZE, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        takes = []
        for _ in range(_TAKES):
            t0 = time.perf_counter()
            for _ in range(_PRODUCTS):
                torch.mm(a, a)
            takes.append((time.perf_counter() - t0) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(takes)


def spread(probes: Sequence[float]) -> float:
    """Slowest over fastest probe, minus one (0.0 for fewer than two)."""
    kept = [p for p in probes if p > 0]
    return max(kept) / min(kept) - 1 if len(kept) > 1 else 0.0


def format_probes(probes: Sequence[float]) -> str:
    """The graph-meta form of a list of probes (meta values are strings)."""
    return ",".join(f"{p:.3f}" for p in probes)


def parse_probes(text: str) -> tuple[float, ...]:
    """The probes of :func:`format_probes`; () for an empty or unreadable value (an older graph)."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        return ()
