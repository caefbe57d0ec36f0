"""NCCL_ALGO in the job's env picks prism's all-reduce algorithm the way it restricts NCCL's."""

import pytest

from prism.core.errors import ConfigError
from prism.nccl_patches.algorithms import policy_from_env


@pytest.mark.parametrize("value, tree", [
    ("", False),
    ("Ring", False),
    ("Tree", True),
    ("tree,collnetchain", True),
    ("Tree,Ring", False),            # NCCL's tuner would choose by size; prism keeps the ring
    ("^ring", True),
    ("^tree", False),
    ("allreduce:tree;allgather:ring", True),
    ("allgather:tree", False),       # no restriction on all-reduce
    ("allreduce:^ring,nvls", True),
])
def test_all_reduce_runs_as_a_tree_only_when_ring_is_excluded(value, tree):
    assert policy_from_env({"NCCL_ALGO": value}).tree_all_reduce is tree


def test_no_nccl_algo_means_ring():
    assert policy_from_env({}).all_reduce == "ring"


@pytest.mark.parametrize("value, fragment", [
    ("Trie", "unknown algorithm trie"),
    ("allreduc:tree", "'allreduc:tree'"),
    ("allreduce:", "unknown algorithm"),
])
def test_a_bad_value_names_the_env_key(value, fragment):
    with pytest.raises(ConfigError) as e:
        policy_from_env({"NCCL_ALGO": value})
    assert str(e.value).startswith("env.NCCL_ALGO:")
    assert fragment in str(e.value)
