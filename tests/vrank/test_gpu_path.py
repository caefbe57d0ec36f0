"""The nccl data path on two GPUs (runs only where at least two CUDA devices are): the DDP example
at W=2, rank 0 on the sandbox GPU and vrank 1 on the assistant GPU. The emulated rank's losses equal
the collected (capture) run's bitwise, and its ``max_memory_allocated`` equals the real NCCL run's
(prism record) in bytes. bench/gpu_fidelity.py has the timing figures."""

import pytest
import torch
import yaml

from prism.cli.validate import validate
from tests.conftest import EXAMPLES

pytestmark = [pytest.mark.timeout(900), pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


def test_ddp_w2_emulated_on_a_sandbox_and_an_assistant_gpu(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "ddp-gpu", "entrypoint": str(EXAMPLES / "ddp/train.py"),
        "args": ["--device", "cuda", "--batch", "256", "--dim", "256", "--hidden", "256", "--layers", "6",
                 "--bucket-cap-mb", "1", "--steps", "5"],
        "world_size": 2, "ranks_per_node": 2, "device": "cuda", "iterations": {"warmup": 2, "measured": 3}}))
    result = validate(str(job), "0", str(tmp_path / "run"), slice_size=1, timeout_s=600, torch_fake=False,
                      device={"device_path": "nccl", "sandbox_gpus": (0,), "assistant_gpus": (1,)})
    prism = result["ranks"][0]["prism"]
    assert prism["signature_match"] == 1.0 and prism["diverged_ops"] == 0
    assert prism["losses_bitwise_collected"], prism
    assert prism["peak_memory_bytes"] == prism["real_peak_memory_bytes"], prism
