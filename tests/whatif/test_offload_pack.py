"""The examples' activation-offload knobs (docs/whatif.md, "Config what-ifs"): the pack hook returns
the saved tensor's values in host memory for every layout autograd saves (contiguous, strided,
transposed, offset, empty, 0-d), keeps the tensor's storage resizable (FSDP2 frees an unsharded
parameter by resizing its storage to 0), and the host copy is never counted by the CPU memory
tracker, not even for the length of the pack: offloaded bytes are not the rank's tensor memory."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from prism.sandbox.memtrack import StoragePeakTracker

pytestmark = pytest.mark.timeout(60)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def offload_hooks(example: str):
    spec = importlib.util.spec_from_file_location(f"{example}_train_for_offload", EXAMPLES / example / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.offload_activations(torch.device("cpu"))


def layouts() -> list:
    """Each made inside the tracker (a saved activation's storage is counted already)."""
    return [
        lambda: torch.randn(64, 32),
        lambda: torch.randn(64, 32)[:, ::2],
        lambda: torch.randn(32, 64).t(),
        lambda: torch.randn(100)[10:90],
        lambda: torch.arange(60, dtype=torch.int64).view(5, 12)[1:, 2:],
        lambda: torch.empty(0, 8),
        lambda: torch.tensor(2.5) + 0,
    ]


@pytest.mark.parametrize("example", ["ddp", "fsdp2"])
def test_the_pack_copies_every_layout_and_the_tracker_never_counts_the_host_copy(example):
    hooks = offload_hooks(example)
    for make in layouts():
        with StoragePeakTracker() as tracker:
            t = make()
            before = tracker.peak_bytes
            host = hooks.pack_hook(t)
            assert tracker.peak_bytes == before, (example, t.shape, t.stride())
            back = hooks.unpack_hook(host)
        assert isinstance(host, np.ndarray) and host.shape == tuple(t.shape)
        assert torch.equal(back, t), (example, t.shape, t.stride())


def test_fsdp2s_pack_leaves_the_storage_resizable():
    hooks = offload_hooks("fsdp2")
    param = torch.randn(16, 16)
    hooks.pack_hook(param)
    param.untyped_storage().resize_(0)  # what FSDP2 does to free an unsharded parameter
    assert param.untyped_storage().nbytes() == 0
