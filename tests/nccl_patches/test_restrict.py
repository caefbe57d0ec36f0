"""RecordedCollective.restrict: the record of a sandbox subset, computed from the superset's
record alone, equals (bit for bit) what the collector records for the subset from every input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core.errors import PrismError
from prism.nccl_patches.compensation import record_for_sandbox
from prism.nccl_patches.schedule import Algo
from tests.nccl_patches.cases import DTYPES, make_inputs, ops_for, sandbox_subsets

pytestmark = pytest.mark.timeout(300)

FIELDS = ("inputs", "outputs", "premul", "entry_partials", "subtree_partials", "in_splits", "out_splits")


def assert_same_record(got, want):
    assert (got.algo, got.group_size, got.sandbox, got.reduce_op, got.root, got.peer, got.row_numel) == (
        want.algo, want.group_size, want.sandbox, want.reduce_op, want.root, want.peer, want.row_numel)
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert sorted(a) == sorted(b), name
        for k in b:
            if isinstance(b[k], torch.Tensor):
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (name, k)
            else:
                assert a[k] == b[k], (name, k)


@st.composite
def cases(draw):
    n = draw(st.integers(2, 64))
    algo = draw(st.sampled_from(list(Algo)))
    if algo is Algo.P2P:
        n = 2
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from(ops_for(dtype))) if algo.reduces else ""
    numel = n * draw(st.integers(1, 3)) if algo in (Algo.RING_REDUCE_SCATTER, Algo.DIRECT_ALL_TO_ALL) \
        else draw(st.integers(1, 2 * n + 3))
    superset = draw(sandbox_subsets(n))
    subset = draw(st.lists(st.sampled_from(superset), min_size=1, max_size=len(superset), unique=True))
    return algo, n, dtype, op, numel, superset, tuple(sorted(subset)), draw(st.integers(0, 10**6))


@given(cases())
@settings(max_examples=150, deadline=None)
def test_a_restricted_record_equals_the_subsets_own_record(case):
    algo, n, dtype, op, numel, superset, subset, seed = case
    inputs = make_inputs(n, numel, dtype, seed)
    kw = {}
    if op == "premul_sum":
        kw["premul"] = [0.5 + (r % 7) / 4 for r in range(n)]
    if algo is Algo.CHAIN_BROADCAST:
        kw["root"] = seed % n
    if algo is Algo.P2P:
        kw.update(root=0, peer=1)
    big = record_for_sandbox(inputs, algo, op, superset, **kw)
    assert_same_record(big.restrict(subset), record_for_sandbox(inputs, algo, op, subset, **kw))


def test_only_a_non_empty_subset_can_be_restricted_to():
    rec = record_for_sandbox(make_inputs(8, 16, torch.float32, 1), Algo.RING_ALL_REDUCE, "sum", [2, 3, 5])
    with pytest.raises(PrismError, match=r"to \[2, 4\]"):
        rec.restrict([2, 4])
    with pytest.raises(PrismError, match="not a non-empty subset"):
        rec.restrict([])
