"""RankLens §V-D: a NaN from rank 1 reproduced on rank 0 alone, from the recorded payloads.

Two real 2-rank gloo runs of examples/anomaly (DDP, 577 fp32 parameters, SGD): a normal one and
one where rank 1 puts a NaN into its first gradient bucket. ``replay --rank 0 --values`` runs
rank 0 alone; its gradients and updated parameters must have the NaNs where the real faulty run
has them and every finite element bitwise equal, and with the normal run's payloads be bitwise
equal to the normal run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from prism.core.config import load_job
from prism.sandbox.recording import record_job
from prism.sandbox.replaying import replay_rank

from ..conftest import EXAMPLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"normal"|"faulty": (run dir, dump dir, rank 0's real dump)}, recorded with payloads."""
    root = tmp_path_factory.mktemp("anomaly")
    base = load_job(EXAMPLES / "anomaly" / "job.yaml")
    out = {}
    for name, nan_rank in (("normal", -1), ("faulty", 1)):
        dump = root / f"dump-{name}"
        job = dataclasses.replace(base, args=("--steps", "1", "--nan-rank", str(nan_rank), "--dump", str(dump)))
        record_job(job, root / name, payloads=True, timeout_s=240)
        real = torch.load(dump / "rank-0.pt")
        (dump / "rank-0.pt").unlink()
        out[name] = (root / name, dump, real)
    return out


def _replayed(run: Path, dump: Path) -> list[dict]:
    result = replay_rank(run, 0, values=True, timing="none", timeout_s=240)
    assert result.record.summary.exit_code == 0
    return torch.load(dump / "rank-0.pt")


def _nan_positions(t: torch.Tensor) -> list[int]:
    return torch.isnan(t).nonzero().flatten().tolist()


def test_faulty_payload_reproduces_nan_positions_and_finite_values_bitwise(runs):
    run, dump, real = runs["faulty"]
    replayed = _replayed(run, dump)
    for key in ("grad", "param"):
        r, e = real[0][key], replayed[0][key]
        assert r.numel() == 577
        assert _nan_positions(r) == [0], "the faulty real run has exactly one NaN (the injected element)"
        assert _nan_positions(e) == _nan_positions(r)
        finite = ~torch.isnan(r)
        assert torch.equal(e[finite], r[finite])  # bitwise: same dtype, same values


def test_normal_payload_replays_the_normal_run_bitwise(runs):
    run, dump, real = runs["normal"]
    replayed = _replayed(run, dump)
    for key in ("grad", "param"):
        assert torch.isfinite(real[0][key]).all()
        assert torch.equal(replayed[0][key], real[0][key])
