"""GPU context switching (runs only where CUDA is available)."""

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = [pytest.mark.timeout(600), pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_driver_checkpoint_api_is_bound():
    from prism.coordinator.cuda_checkpoint import CudaCheckpoint

    api = CudaCheckpoint()
    idle = subprocess.Popen(["sleep", "30"])
    try:
        assert api.get_state(idle.pid) is None  # a process without a CUDA context has no state
    finally:
        idle.kill()
        idle.wait()


def test_ranks_beyond_the_slots_are_swapped_off_the_gpu_and_back_intact():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu_collect_swap.py"), "--gib-per-rank", "1", "--budget-gib", "5",
         "--steps", "1", "--timeout", "500"],
        capture_output=True, text=True, timeout=580,
    )
    out = json.loads(proc.stdout)
    assert out["ok"], out.get("error")
    assert out["swaps"]["swap_out"]["count"] > 0
    assert out["swaps"]["num_swaps_out"] == out["swaps"]["num_swaps_in"]
    assert out["within_budget"]
