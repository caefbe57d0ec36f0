"""The ``torch-fake`` engine: PyTorch's own fake process group, observed by prism's recorder.

This is the free tool users already have (torchtitan's ``COMM_MODE=fake_backend``, Megatron's
fake process group): every op completes at once and outputs are whatever the fake backend leaves
in the buffers. prism uses it only as a baseline in ``prism validate``, to show on the same job
what a lone rank under that tool sees (wrong values, value-dependent control flow that crashes,
no waits on peers).
"""

from __future__ import annotations

from torch._C._distributed_c10d import FakeProcessGroup

from .base import GroupHandle
from .passthrough import PassthroughEngine

__all__ = ["TorchFakeEngine"]


class TorchFakeEngine(PassthroughEngine):
    name = "torch-fake"
    divides_avg = False

    def create_group(self, group: GroupHandle, store) -> None:
        pg = FakeProcessGroup._create_internal(group.group_rank, group.size, FakeProcessGroup.Options())
        self._gloo[group.group_id] = pg
