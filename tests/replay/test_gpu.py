"""``prism replay --values`` on a CUDA job (runs only where CUDA is available): the recorded
outputs (kept on the host) are restored into the rank's device tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.sandbox.replaying import replay_rank

from ..conftest import EXAMPLES

pytestmark = [pytest.mark.timeout(600), pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_values_replay_of_a_cuda_pipeline_gives_the_recorded_losses(tmp_path, device="cuda"):
    job = load_job(EXAMPLES / "synthetic" / "job.yaml")
    job = dataclasses.replace(
        job, world_size=4, ranks_per_node=4, device=device,
        args=("--steps", "3", "--dp", "2", "--pp", "2", "--microbatches", "2", "--fwd-ms", "1", "--bwd-ms", "1",
              "--device", device),
        parallelism=dataclasses.replace(job.parallelism, dp=2, pp=2))
    # several ranks on one GPU: gloo with CUDA tensors; the dp all-reduce carries the peer's gradient,
    # so the losses after step 0 depend on the restored values
    graph = record_job(job, tmp_path / "run", cuda_backend="gloo", payloads=True)
    for rank in (0, 3):
        result = replay_rank(tmp_path / "run", rank, values=True, timing="none")
        assert result.record.summary.losses == graph.summaries[rank].losses
