"""The MoE mock router (job file ``moe_router``, docs/moe-router.md): the requested balance-ratio
statistics become a routing plan whose realised ratios match them; on the moe example (W=4, one EP
group) the gate's logits are overwritten in place so the script's own top-1 routing follows the
plan; an emulation of the hottest rank reproduces its real peak to the byte, and with a cap under
that peak runs out of memory where the real run does."""

import json

import numpy as np
import pytest

from prism.core.balance import br_stats, fit_ratios, realised_ratios, router_summary, shares, token_matrix
from prism.core.config import job_from_dict
from prism.core.errors import ConfigError, RankOOMError
from prism.sandbox.recording import record_job
from prism.vrank_replayer import EmulateOptions, capture_job
from prism.vrank_replayer.emulate_report import emulate_and_report
from tests.conftest import EXAMPLES, peaks_a_real_run_reaches

pytestmark = pytest.mark.timeout(300)

SKEWED = [0.55, 0.6, 0.75, 0.9, 1.0, 1.15, 1.25, 1.8]


def within(realised: dict, target: dict, rel=0.05) -> list[str]:
    return [k for k in ("min", "max", "avg", "std", "med", "skew")
            if abs(realised[k] - target[k]) > rel * max(abs(target[k]), 0.05)]


def test_the_plan_realises_the_requested_statistics_within_5_percent():
    target = br_stats(SKEWED)
    ratios = fit_ratios(target, 8)
    assert within(br_stats(ratios), target, rel=0.01) == []
    for tokens in (64, 256):
        per_dest = shares(ratios, tokens)
        assert sum(per_dest) == 8 * tokens
        m = token_matrix(per_dest, tokens)
        assert all(sum(row) == tokens for row in m)  # every rank routes all its tokens
        assert within(br_stats(realised_ratios(dict(enumerate(m)))), target) == []


def test_a_balanced_router_is_exactly_even():
    ratios = fit_ratios({"min": 1, "max": 1, "avg": 1, "std": 0, "med": 1, "skew": 0}, 4)
    assert np.allclose(ratios, 1) and shares(ratios, 16) == [16] * 4


def job(br: dict, **extra) -> dict:
    return {"name": "moe-router", "entrypoint": str(EXAMPLES / "moe/train.py"),
            "args": ["--steps", "2", "--ep", "4", "--tokens", "64"], "world_size": 4,
            "iterations": {"warmup": 1, "measured": 1}, "parallelism": {"dp": 4, "ep": 4},
            "moe_router": {"gate": "MoEModel.router", "br": br}, **extra}


def test_the_job_file_refuses_a_mean_other_than_one_and_names_the_key():
    with pytest.raises(ConfigError, match=r"moe_router\.br\.avg: must be 1"):
        job_from_dict(job({"min": 0.71, "max": 2.16, "avg": 1.48, "std": 0.37, "med": 1.38, "skew": 0.9}))
    with pytest.raises(ConfigError, match=r"moe_router\.gate"):
        job_from_dict(dict(job(br_stats(SKEWED[:4])), moe_router={"gate": "router", "br": br_stats(SKEWED[:4])}))


@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory):
    target = br_stats([0.5, 0.8, 1.0, 1.7])
    run = tmp_path_factory.mktemp("moe-router") / "run"
    graph = record_job(job_from_dict(job(target)), run, timeout_s=150)
    return run, graph, target


def test_the_real_run_routes_as_requested_and_the_hot_rank_emulates_to_its_peak(skewed_run, tmp_path):
    run, graph, target = skewed_run
    logs = [json.loads((run / "logs" / f"rank-{r:05d}.moe_router.json").read_text()) for r in range(4)]
    summary = router_summary(logs)
    for step, row in summary["groups"]["0"].items():
        assert within(row["stats"], target) == [], (step, row["stats"], target)
    # the hot rank of the measured step (step 1) holds the most tokens, hence the highest peak
    br1 = summary["groups"]["0"]["1"]["br"]
    hot = int(max(br1, key=br1.get))
    peaks = {r: s.measured_peak_memory_bytes for r, s in graph.summaries.items()}
    assert max(peaks, key=peaks.get) == hot, (peaks, br1)
    capture_job(job_from_dict(job(target)), run, timeout_s=150)
    report = emulate_and_report(run, EmulateOptions(ranks=(hot,), timeout_s=150, out_dir=str(tmp_path / "emu")),
                                use_timed=False)
    row = report.data["ranks"][str(hot)]
    emulated = row["measured_peak_memory_bytes"]
    seen = peaks_a_real_run_reaches(  # to the byte (one real run in ~40 peaked 4 KiB higher once)
        emulated, peaks[hot], lambda i: record_job(job_from_dict(job(target)), tmp_path / f"real{i}",
                                                   timeout_s=150).summaries[hot].measured_peak_memory_bytes)
    assert emulated in seen, (emulated, seen)
    assert report.data["moe_router"]["groups"]["0"]["1"]["br"] == br1  # its tokens, the recorded ones
    # a cap between the hot rank's peak and the next one: it runs out in the emulation
    second = sorted(peaks.values())[-2]
    cap = (peaks[hot] + second) // 2
    with pytest.raises(RankOOMError):
        from prism.vrank_replayer.launch import emulate
        emulate(run, EmulateOptions(ranks=(hot,), timeout_s=150, memory_cap_bytes=cap, out_dir=str(tmp_path / "cap")))
