"""The device data paths: nccl on two GPUs (runs only where at least two CUDA devices are), the DDP example
at W=2, rank 0 on the sandbox GPU and vrank 1 on the assistant GPU. The emulated rank's losses equal
the collected (capture) run's bitwise, and its ``max_memory_allocated`` equals the real NCCL run's
(prism record) in bytes. bench/gpu_fidelity.py has the timing figures. On a host with one GPU, the ipc
path instead (the second test)."""

import pytest
import torch
import yaml

from prism.cli.validate import validate
from tests.conftest import EXAMPLES

pytestmark = [pytest.mark.timeout(900), pytest.mark.gpu]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="the two-GPU test above covers the data path")
def test_ddp_w2_emulated_on_one_gpu_over_cuda_ipc(tmp_path):
    """One GPU (the ipc path): collect (a real NCCL run of W=2 cannot run on one GPU), calibrate and
    emulate rank 0 with vrank 1's replayer on the same GPU; the lane is CUDA IPC and the emulated
    rank's losses equal the collected ones bitwise. bench/gpu_one.py has the timing figures."""
    import json
    from pathlib import Path

    from prism.coordinator import CollectOptions, collect_job
    from prism.core.config import load_job
    from prism.vrank_replayer import EmulateOptions, captured_losses
    from prism.vrank_replayer.calibrate_run import calibrate_run
    from prism.vrank_replayer.emulate_report import emulate_and_report
    from prism.vrank_replayer.fidelity import losses_bitwise_equal

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "ddp-one-gpu", "entrypoint": str(EXAMPLES / "ddp/train.py"),
        "args": ["--device", "cuda", "--batch", "256", "--dim", "256", "--hidden", "256", "--layers", "6",
                 "--bucket-cap-mb", "1", "--steps", "5"],
        "world_size": 2, "ranks_per_node": 2, "device": "cuda", "slots": 2,
        "iterations": {"warmup": 2, "measured": 3}}))
    run = tmp_path / "run"
    collect_job(load_job(str(job)), run, CollectOptions(slots=2, timeout_s=600))
    layout = {"device_path": "ipc", "sandbox_gpus": (0,), "assistant_gpus": (0,)}
    calibrate_run(run, slice_size=1, timeout_s=600, device=layout)
    emu = emulate_and_report(run, EmulateOptions(ranks=(0,), timeout_s=600, **layout), skip_steps=2)
    live = json.loads((Path(emu.out_dir) / "rank-00000.live.json").read_text())
    assert live["device_path"] == "ipc" and live["lane_kinds"] == {"ipc": 1}, live
    report = json.loads((Path(emu.out_dir) / "report.json").read_text())["ranks"]["0"]
    assert report["diverged_ops"] == []
    assert losses_bitwise_equal(report["losses"], captured_losses(run, 0))
