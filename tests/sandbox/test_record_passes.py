"""``prism record`` on CPU times the job without the per-op memory tracker: a memory pass (tracked,
untimed) gives the peaks, a timed pass (no dispatch mode) gives nodes, step times and losses. The
peaks are those of a single tracked run of the same program.

The script frees tensors right after their all-reduce. ProcessGroupGloo's worker thread drops its
reference to a collective's tensors only after waking the script, so before the passthrough engine
handed gloo non-owning aliases, such a tensor was still alive at the next allocation in a few
percent of the ops (bench/gloo_hold.py), and two tracked runs of this script disagreed by 256 B or
1 KiB (#12)."""

import dataclasses
import textwrap

import pytest
import yaml

from prism.core.config import load_job
from prism.graph.memory_pass import PASS_ENV, SEPARATE_PASS, TRACKED_INLINE, timed_with_tracker
from prism.sandbox.recording import cuda_backend_of, record_job

pytestmark = pytest.mark.timeout(120)

TEMPORARY_BYTES = 256 * 4
"""The script's per-op temporary, ``torch.ones(256)``."""


def held_temporaries(x: int, y: int) -> bool:
    """Two separate runs' peaks agree up to the temporaries gloo's thread can still hold past the
    script's next allocations under load (seen: one, and two at load 4 beside a busy loop)."""
    return abs(x - y) % TEMPORARY_BYTES == 0 and abs(x - y) <= 3 * TEMPORARY_BYTES

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    modes = []
    for step in range(3):
        # Activations of a size that depends on the step: a peak the two passes must agree on.
        x = torch.ones(32 * (step + 1), 64)
        loss = model(x).square().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()  # the all-reduced grads are freed here
        for _ in range(30):  # temporaries freed right after their all-reduce, then a larger buffer
            t = torch.ones(256)
            dist.all_reduce(t)
            del t
            big = torch.empty(4096)
            del big
        modes.append([type(m).__name__ for m in _get_current_dispatch_mode_stack()])
    with open(os.path.join(sys.argv[1], f"{os.environ.get('%s', 'single')}-{rank}.json"), "w") as f:
        json.dump(modes, f)
    dist.destroy_process_group()
""" % PASS_ENV)


@pytest.fixture
def job(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "seen"
    out.mkdir()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "passes", "entrypoint": "train.py", "args": [str(out)], "world_size": 2,
        "iterations": {"warmup": 1, "measured": 2}, "parallelism": {"dp": 2}}))
    return load_job(tmp_path / "job.yaml"), out


def _modes(out, name, rank):
    import json

    return json.loads((out / f"{name}-{rank}.json").read_text())


def test_the_timed_pass_runs_without_a_dispatch_mode_and_keeps_the_tracked_peaks(job, tmp_path):
    job, out = job
    two = record_job(job, tmp_path / "two", timeout_s=60)
    one = record_job(job, tmp_path / "one", timeout_s=60, memory_pass=False)
    for r in range(2):
        assert _modes(out, "memory", r) == [["StoragePeakTracker"]] * 3
        assert _modes(out, "timed", r) == [[]] * 3, "the timed pass must not pay the per-op tracker"
        assert _modes(out, "single", r) == [["StoragePeakTracker"]] * 3
        a, b = two.summaries[r], one.summaries[r]
        assert a.memory_source == b.memory_source == "cpu.tracked_storage_peak"
        # Two separate real runs: equal, except that under heavy load gloo's thread can still hold
        # one 256-float temporary past the script's next allocation (seen once in CI beside a busy
        # loop and a concurrent `make demo`: 165,128 vs 164,104 B). Never more than that one tensor.
        assert held_temporaries(a.peak_memory_bytes, b.peak_memory_bytes)
        assert held_temporaries(a.measured_peak_memory_bytes, b.measured_peak_memory_bytes)
        assert a.measured_peak_memory_bytes > 0 and a.peak_memory_bytes >= a.measured_peak_memory_bytes
        assert len(a.step_times_ns) == 3 and a.losses == b.losses
    # A run whose steps were timed with the tracker says so: calibrate and emulate warn before
    # comparing their times with it (the slices run untracked).
    assert (two.meta.get("memory"), one.meta.get("memory")) == (SEPARATE_PASS, TRACKED_INLINE)
    assert not timed_with_tracker(two.meta) and timed_with_tracker(one.meta)
    assert [n.is_comm for n in two.nodes[0]].count(True) == [n.is_comm for n in one.nodes[0]].count(True)


def test_with_prism_memory_rss_there_is_one_pass(job, tmp_path, monkeypatch):
    job, out = job
    monkeypatch.setenv("PRISM_MEMORY", "rss")
    graph = record_job(job, tmp_path / "rss", timeout_s=60)
    assert sorted(p.name for p in out.iterdir()) == ["single-0.json", "single-1.json"]
    assert graph.summaries[0].memory_source == "cpu.peak_rss"
    assert not timed_with_tracker(graph.meta), "no tracker ran: the steps are the plain job's"


def test_a_cpu_job_is_recorded_on_gloo_alone_where_gpus_are_present(job):
    """A CPU job's plain launch makes gloo groups only: on a GPU host its recording must not add a
    ProcessGroupNCCL (and its threads) to each group; a CUDA job keeps the backend asked for."""
    cpu, _ = job
    cuda = dataclasses.replace(cpu, device="cuda")
    assert cpu.device == "cpu" and cuda_backend_of(cpu, "nccl") == "gloo"
    assert cuda_backend_of(cuda, "nccl") == "nccl"
    assert cuda_backend_of(cuda, "gloo") == "gloo"
