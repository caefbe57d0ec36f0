"""Cost of verifying what prism reads back: a payload, a pruned record and a capture of SIZE MiB,
read without a check (what prism did before) and with it.

    python bench/integrity_cost.py [--mib 64] [--repeats 7] [--out FILE.json]

Rows (medians over the repeats; wall and CPU seconds of this process, files in the page cache).
safetensors maps a file lazily, so an unchecked load reads no data; the consumer reads it later
(a send, a compare). The baseline is therefore "unchecked + read once": the load and one pass
over every tensor (a clone), the least any use of the data costs; the extra of a checked read over
it is the price of the check.
* payload, unchecked: ``safetensors.torch.load_file``.
* payload, checked first read: ``load_payload`` on a file this process has not verified (the
  file's time is touched before each repeat, so it counts as new): load + :func:`payload_hash`.
* payload, later reads: ``load_payload`` of a verified file (a ``stat`` and the load).
* pruned record, unchecked / checked: the tensors of one record through ``safe_open`` alone, and
  ``load_recorded`` (which hashes every tensor and the metadata).
* capture, unchecked / checked: ``load_file`` of ``rank-R.safetensors``, and the sha256 of the
  file streamed from disk + ``load_file``, as ``derive_from_capture`` reads it.
(The capture read uses the private reader of ``recorded_store``: it is what ``derive_from_capture``
does per rank.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from prism.coordinator.payloads import PayloadStore, load_payload
from prism.nccl_patches import Algo, record_for_sandbox
from prism.nccl_patches.compensation import RecordedCollective
from prism.nccl_patches.recorded_store import _Capture, _path, collective_key, load_recorded, save_recorded, write_capture


def _timed(fn, repeats: int, before=None) -> dict:
    walls, cpus = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def _read_once(tensors) -> None:
    if isinstance(tensors, RecordedCollective):
        tensors = [t for d in (tensors.inputs, tensors.outputs, tensors.entry_partials, tensors.subtree_partials)
                   for t in d.values()]
    for t in tensors.values() if isinstance(tensors, dict) else tensors:
        t.clone()


def _touch(path: Path):
    def f() -> None:
        ns = time.time_ns()
        os.utime(path, ns=(ns, ns))
    return f


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default=None)
    ns = p.parse_args()
    numel = ns.mib * 1024 * 1024 // 4
    g = torch.Generator().manual_seed(0)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        # payload
        x = torch.randn(numel, generator=g)
        digest = PayloadStore(run / "payloads").put([x])
        path = run / "payloads" / f"{digest}.safetensors"
        rows["payload, unchecked"] = _timed(lambda: load_file(str(path)), ns.repeats)
        rows["payload, unchecked + read once"] = _timed(lambda: _read_once(load_file(str(path))), ns.repeats)
        rows["payload, checked first read + read once"] = _timed(
            lambda: _read_once(load_payload(run / "payloads", digest)), ns.repeats, before=_touch(path))
        load_payload(run / "payloads", digest)
        rows["payload, later reads + read once"] = _timed(lambda: _read_once(load_payload(run / "payloads", digest)),
                                                          ns.repeats)
        # pruned record: a 2-rank ring all-reduce whose sandbox is rank 0 stores about SIZE in all
        half = numel // 2
        rec = record_for_sandbox([torch.randn(half, generator=g) for _ in range(2)], Algo.RING_ALL_REDUCE, "sum", [0])
        key = collective_key("0", 0, 0)
        save_recorded(run / "pruned", key, rec)
        rpath = _path(run / "pruned", key)

        def unchecked_record(read: bool) -> None:
            with safe_open(str(rpath), framework="pt") as f:
                f.metadata()
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            if read:
                _read_once(tensors)

        rows["pruned record, unchecked"] = _timed(lambda: unchecked_record(False), ns.repeats)
        rows["pruned record, unchecked + read once"] = _timed(lambda: unchecked_record(True), ns.repeats)
        rows["pruned record, checked + read once"] = _timed(lambda: _read_once(load_recorded(run / "pruned", key)),
                                                            ns.repeats)
        # capture
        write_capture(run / "capture", 0, {"c/0/0/in/0": x}, [])
        cpath = run / "capture" / "rank-00000.safetensors"
        rows["capture, unchecked"] = _timed(lambda: load_file(str(cpath)), ns.repeats)
        rows["capture, unchecked + read once"] = _timed(lambda: _read_once(load_file(str(cpath))), ns.repeats)
        rows["capture, checked + read once"] = _timed(lambda: _read_once(_Capture(run / "capture")._load_tensors(0)),
                                                      ns.repeats)
        sizes = {"payload": path.stat().st_size, "pruned record": rpath.stat().st_size, "capture": cpath.stat().st_size}
    print(f"{'read':38} {'MiB':>6} {'wall ms':>9} {'cpu ms':>8} {'+cpu ms vs read once':>21}")
    for name, r in rows.items():
        kind = name.split(",")[0]
        base = rows[f"{kind}, unchecked + read once"]["cpu_s"]
        extra = "" if "unchecked" in name else f"{1e3 * (r['cpu_s'] - base):+.1f}"
        print(f"{name:38} {sizes[kind] / 2**20:6.1f} {1e3 * r['wall_s']:9.1f} {1e3 * r['cpu_s']:8.1f} {extra:>21}")
    if ns.out:
        Path(ns.out).write_text(json.dumps({"mib": ns.mib, "repeats": ns.repeats, "bytes": sizes, "rows": rows},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()
