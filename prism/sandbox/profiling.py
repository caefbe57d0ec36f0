"""``--profile``: run a rank's script under ``torch.profiler`` and keep a Chrome trace per rank.

The trace is torch's own (``export_chrome_trace``: the script's ops, autograd, ``c10d::*`` calls,
CUDA kernels on GPU), so Perfetto, chrome://tracing and HTA read it as usual. prism adds one
track, ``prism comm``, with what its recorder saw: every comm op from issue to completion
(``all_reduce g7:12``, with bytes, shapes, call site and step), every wait, and step ends. The
two clocks are tied by a ``prism::clock_sync`` marker emitted at a known ``perf_counter_ns`` time.
The trace carries ``distributedInfo`` (backend ``prism``, rank, world size) as HTA expects.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from prism.graph.records import NodeKind, RankRecord

__all__ = ["RankProfiler", "profile_path", "SYNC_MARK", "COMM_TRACK"]

log = logging.getLogger(__name__)

SYNC_MARK = "prism::clock_sync"
COMM_TRACK = "prism comm"
_COMM_TID = 0x70726973  # "pris": a thread id no real thread has


def profile_path(profile_dir: str | Path, rank: int) -> Path:
    return Path(profile_dir) / f"rank{rank}.json"


class RankProfiler:
    """Context manager around the script's run; :meth:`export` writes the trace afterwards."""

    def __init__(self, profile_dir: str | Path, *, rank: int, world_size: int, device: str) -> None:
        self.path = profile_path(profile_dir, rank)
        self.rank = rank
        self.world_size = world_size
        activities = [ProfilerActivity.CPU]
        if device == "cuda" and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, record_shapes=True)
        self._sync_ns = 0

    def __enter__(self) -> RankProfiler:
        self._prof.start()
        self._prof.add_metadata_json(
            "distributedInfo", json.dumps({"backend": "prism", "rank": self.rank, "world_size": self.world_size}))
        self._sync_ns = time.perf_counter_ns()
        with record_function(SYNC_MARK):
            pass
        return self

    def __exit__(self, *exc) -> None:
        self._prof.stop()

    def export(self, record: RankRecord | None) -> Path:
        """Write the trace, with the recorder's comm ops of ``record`` as the ``prism comm`` track."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(self.path))
        if record is not None:
            trace = json.loads(self.path.read_text())
            trace["traceEvents"].extend(_comm_events(trace["traceEvents"], record, self._sync_ns))
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(trace))
            tmp.replace(self.path)
        log.info("rank %d: profile in %s", self.rank, self.path)
        return self.path


def _comm_events(events: list[dict], record: RankRecord, sync_ns: int) -> list[dict]:
    sync = next((e for e in events if e.get("name") == SYNC_MARK and e.get("ph") == "X"), None)
    if sync is None:
        log.warning("rank %d: no %s marker in the profile; the prism comm track is left out", record.rank, SYNC_MARK)
        return []
    pid = sync["pid"]
    sync_rec_ns = sync_ns - record.clock_origin_ns  # the marker's time on the recorder's clock

    def ts(ns: int) -> float:
        return sync["ts"] + (ns - sync_rec_ns) / 1000.0

    out: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": _COMM_TID, "args": {"name": COMM_TRACK}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": _COMM_TID, "args": {"sort_index": -1}},
    ]
    for n in record.nodes:
        if n.start_ns < 0:
            continue
        if n.kind in (NodeKind.COLLECTIVE, NodeKind.SEND, NodeKind.RECV):
            peer = f" peer {n.peer}" if n.kind is not NodeKind.COLLECTIVE else ""
            out.append({"ph": "X", "cat": "prism_comm", "name": f"{n.op.value} g{n.group_id}:{n.seq}{peer}",
                        "pid": pid, "tid": _COMM_TID, "ts": ts(n.start_ns), "dur": max(n.duration_ns, 0) / 1000.0,
                        "args": {"bytes": n.size_bytes, "shapes": [list(s) for s in n.shapes], "dtype": n.dtype,
                                 "async": n.is_async, "call_site": n.call_site, "step": n.step, "index": n.index}})
        elif n.kind is NodeKind.WAIT:
            out.append({"ph": "X", "cat": "prism_wait", "name": f"wait #{n.target}", "pid": pid, "tid": _COMM_TID,
                        "ts": ts(n.start_ns), "dur": max(n.duration_ns, 0) / 1000.0, "args": {"step": n.step}})
        elif n.kind is NodeKind.MARK:
            out.append({"ph": "i", "s": "p", "cat": "prism_step", "name": f"step {n.step} end", "pid": pid,
                        "tid": _COMM_TID, "ts": ts(n.start_ns)})
    return out
