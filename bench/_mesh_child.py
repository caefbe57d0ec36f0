"""One measurement of bench/mesh_scale.py, in a fresh process: become rank W-3 of W and run the
hybrid example's setup (3-D mesh) and one training step, under prism's "prism" group with the
fake engine, or under PyTorch's built-in fake process group. Prints one JSON line."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HYBRID = ROOT / "examples" / "hybrid" / "train.py"


def main() -> None:
    mode, world = sys.argv[1], int(sys.argv[2])
    rank = world - 3
    started = time.perf_counter()
    import torch.distributed.device_mesh as dm

    mesh_s: list[float] = []
    mesh_cpu_s: list[float] = []
    original = dm.init_device_mesh

    def timed_init(*args, **kwargs):
        t, cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            mesh_s.append(time.perf_counter() - t)
            mesh_cpu_s.append(time.process_time() - cpu)

    dm.init_device_mesh = timed_init
    args = ["--steps", "1", "--pp", "2", "--tp", "2", "--dp", str(world // 4)]
    error = ""
    if mode == "prism":
        from prism.core.workerspec import ShimConfig
        from prism.sandbox.engines.fake import FakeEngine
        from prism.sandbox.shim import install, run_entrypoint

        install(ShimConfig(rank=rank, world_size=world, present_ranks=1, is_store_leader=True), FakeEngine())
        try:
            run_entrypoint(str(HYBRID), args)
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            error = f"{type(e).__name__}: {e}"[:300]
    else:
        import runpy

        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        init = dist.init_process_group
        dist.init_process_group = lambda *a, **k: init("fake", store=FakeStore(), rank=rank, world_size=world)
        sys.argv = [str(HYBRID), *args]
        try:
            runpy.run_path(str(HYBRID), run_name="__main__")
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            error = f"{type(e).__name__}: {e}"[:300] or traceback.format_exc()[-300:]
    print(json.dumps({
        "mode": mode,
        "world_size": world,
        "mesh_init_s": mesh_s[0] if mesh_s else None,
        "mesh_init_cpu_s": mesh_cpu_s[0] if mesh_cpu_s else None,
        "total_s": time.perf_counter() - started,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_ok": not error,
        "error": error,
    }))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
