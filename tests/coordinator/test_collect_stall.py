"""A collection that stops moving says why while it waits: which ranks run their script, which
wait in which comm op, which swaps are in flight (the FSDP2 example printed nothing for 420 s)."""

import logging

import pytest

from prism.coordinator import CollectOptions, collect_job
from prism.core.config import load_job
from prism.core.errors import PrismError
from tests.conftest import ASSETS

pytestmark = pytest.mark.timeout(120)


def test_a_stalled_collection_reports_every_rank_while_it_waits(tmp_path, caplog):
    job = load_job(ASSETS / "jobs" / "stall_rank3" / "job.yaml")  # rank 3 sleeps outside any comm op
    caplog.set_level(logging.WARNING, logger="prism.coordinator.collect")
    with pytest.raises(PrismError, match="timed out"):
        collect_job(job, tmp_path / "run", CollectOptions(slots=4, timeout_s=25, stall_report_s=3))
    reports = [r.getMessage() for r in caplog.records if "nothing moved for" in r.getMessage()]
    assert reports, "no stall report"
    last = reports[-1]
    assert "rank 3: running its script (no comm op pending; last: all_reduce" in last
    for r in (0, 1, 2):
        assert f"rank {r}" in last and "all_reduce" in last
