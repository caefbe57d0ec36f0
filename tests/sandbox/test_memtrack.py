"""The tracked CPU peak counts every new storage an op returns, whatever the shape of its result:
one tensor, a tuple (``max(dim)``), a list (``split``, ``_foreach_*``), views and in-place results
(no new storage), and storages freed in between. A storage made before the tracker is counted
from the first op that returns it (a view or an in-place result)."""

import pytest
import torch

from prism.sandbox.memtrack import StoragePeakTracker

pytestmark = pytest.mark.timeout(60)


def test_tuple_and_list_results_count_each_new_storage_once():
    with StoragePeakTracker() as tracker:
        x = torch.zeros(100, 10)  # 4,000 bytes
        values, indices = x.max(dim=1)  # a tuple: 100 f32 + 100 i64
        assert tracker.current_bytes == 4000 + 400 + 800
        parts = x.split(50)  # a list of views: nothing new
        assert tracker.current_bytes == 5200 and len(parts) == 2
        sums = torch._foreach_add([values, values], 1.0)  # a list of two new storages
        assert tracker.current_bytes == 5200 + 800
        values.add_(1.0)  # in place: nothing new
        view = values.view(10, 10)  # a view: nothing new
        assert tracker.current_bytes == 6000 and view.numel() == 100
        del x, parts, sums, indices
        assert tracker.current_bytes == 400  # values (and its view) stay
        y = torch.ones(2000)  # 8,000 bytes
        del y
    assert tracker.peak_bytes == 400 + 8000


def test_a_storage_made_outside_is_counted_from_the_first_op_that_returns_it():
    base = torch.zeros(256)  # 1,024 bytes, made before the tracker
    with StoragePeakTracker() as tracker:
        assert tracker.current_bytes == 0
        base.add_(1.0)
        base.mul_(2.0)
        assert tracker.current_bytes == 1024
        halves = base.split(128)
        assert tracker.current_bytes == 1024 and len(halves) == 2
    assert tracker.peak_bytes == 1024


@pytest.mark.timeout(300)  # imports and runs Dynamo
def test_a_compiled_function_under_the_tracker_runs_and_is_counted():
    @torch.compile(backend="eager")
    def f(a):
        return (a * 2).sin()

    with StoragePeakTracker() as tracker:
        out = f(torch.ones(256))
    assert torch.equal(out, torch.ones(256).mul(2).sin())
    assert tracker.current_bytes >= 1024  # out (and the input) are counted
