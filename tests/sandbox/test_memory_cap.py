"""The CPU memory cap of one rank, in process: the tracker refuses the storage that would take the
tracked bytes above the cap with ``torch.OutOfMemoryError`` (the class CUDA raises), forward or
backward, and the OOM is reported with the rank, the step, the request and the bytes in use."""

import pytest
import torch

from prism.core.config import job_from_dict
from prism.core.errors import ConfigError
from prism.core.units import parse_bytes
from prism.sandbox.memory import MemoryMeter, find_oom
from prism.sandbox.memtrack import StoragePeakTracker

pytestmark = pytest.mark.timeout(60)


def test_an_allocation_above_the_cap_raises_torch_oom_and_is_not_counted():
    tracker = StoragePeakTracker(cap_bytes=10_000, describe=lambda: "rank 3, step 2")
    with tracker:
        keep = torch.zeros(1000)  # 4000 bytes
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.zeros(2000)  # 8000 more: 12,000 > 10,000
        also = torch.zeros(1500)  # 6000: exactly the cap
    assert str(e.value) == ("CPU out of memory (prism memory cap) on rank 3, step 2: tried to allocate 8000 bytes "
                            "with 4000 bytes tracked in use; cap 10000 bytes (6000 bytes free)")
    assert tracker.last_oom == (8000, 4000)
    assert tracker.peak_bytes == 10_000 and keep.numel() + also.numel() == 2500


def test_an_oom_in_backward_keeps_its_class_and_the_meter_reports_it():
    meter = MemoryMeter("cpu", cap_bytes=65_000, rank=1, current_step=lambda: 5)
    layer = torch.nn.Linear(50, 50)
    with meter.measuring():
        h = layer(torch.randn(100, 50, requires_grad=True))  # 50,200 bytes tracked
        with pytest.raises(torch.OutOfMemoryError) as e:
            (h * h).sum().backward()
    wrapped = RuntimeError("Failed to run stage backward")  # what torch.distributed.pipelining raises
    wrapped.__cause__ = e.value
    assert find_oom(wrapped) is e.value and find_oom(RuntimeError("no")) is None
    report = meter.oom_report(wrapped)
    assert (report.rank, report.step, report.cap_bytes, report.device) == (1, 5, 65_000, "cpu")
    assert report.in_use_bytes + report.requested_bytes > 65_000 >= report.in_use_bytes
    assert report.message == str(e.value)


def test_no_cap_no_oom():
    tracker = StoragePeakTracker()
    with tracker:
        torch.zeros(100_000)
    assert tracker.peak_bytes == 400_000 and tracker.last_oom is None


def test_rss_meter_cannot_enforce_a_cap(monkeypatch):
    monkeypatch.setenv("PRISM_MEMORY", "rss")
    with pytest.raises(ValueError, match="PRISM_MEMORY=rss cannot enforce it"):
        MemoryMeter("cpu", cap_bytes=1000)


def test_sizes_and_the_job_key(tmp_path):
    assert [parse_bytes(s) for s in ("600000", "640KiB", "1.5GiB", "2GB", "3 MiB")] == \
        [600_000, 655_360, 1_610_612_736, 2_000_000_000, 3_145_728]
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("lots")
    (tmp_path / "t.py").write_text("")
    base = {"name": "x", "entrypoint": "t.py", "world_size": 2}
    assert job_from_dict(base, base_dir=tmp_path).memory_cap_bytes == 0
    assert job_from_dict({**base, "memory_cap_bytes": 1 << 20}, base_dir=tmp_path).memory_cap_bytes == 1 << 20
    with pytest.raises(ConfigError, match="memory_cap_bytes: must be >= 0"):
        job_from_dict({**base, "memory_cap_bytes": -1}, base_dir=tmp_path)



def test_a_comm_backends_buffers_are_not_the_scripts():
    # gloo allocates temporaries on the caller's thread (an all-gather's flat buffers): none of
    # them is the script's memory (the live engine has none, NCCL keeps its own outside the
    # allocator). The engines call their backend under untracked(); the script's tensors count.
    import datetime

    import torch.distributed as dist

    from prism.sandbox.memtrack import untracked

    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    inp, out = torch.ones(1000), torch.empty(1000)
    tracker = StoragePeakTracker()
    with tracker:
        with untracked():
            pg._allgather_base(out, inp).wait()
        assert tracker.peak_bytes == 0
        mine = torch.zeros(250)
    assert tracker.peak_bytes == mine.nbytes == 1000


def test_only_the_scripts_thread_is_counted_even_where_another_thread_runs_the_mode():
    # ProcessGroupGloo's worker threads run with the dispatch mode of the thread that queued the
    # work; what they allocate is the backend's.
    import threading

    tracker = StoragePeakTracker()
    other = threading.Thread(target=lambda: [tracker.__enter__(), torch.zeros(1000), tracker.__exit__(None, None, None)])
    with tracker:
        mine = torch.zeros(100)
        other.start()
        other.join()
    assert tracker.peak_bytes == mine.nbytes == 400
