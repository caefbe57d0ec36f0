"""Hypothesis strategies and input makers shared by the nccl_patches tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
FLOAT_OPS = ("sum", "avg", "premul_sum", "product", "min", "max")
INT_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@st.composite
def sandbox_subsets(draw, n: int) -> tuple[int, ...]:
    """One rank, one block, several separated blocks, all but one, or any subset of a ring of n."""
    shape = draw(st.sampled_from(["one", "block", "blocks", "all_but_one", "any"]))
    if shape == "one" or n == 1:
        ranks = {draw(st.integers(0, n - 1))}
    elif shape == "block":
        start, length = draw(st.integers(0, n - 1)), draw(st.integers(1, n))
        ranks = {(start + k) % n for k in range(length)}
    elif shape == "blocks" and n >= 4:
        starts = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=4, unique=True))
        ranks = {(s + k) % n for s in starts for k in range(draw(st.integers(1, 3)))}
    elif shape == "all_but_one":
        gone = draw(st.integers(0, n - 1))
        ranks = set(range(n)) - {gone}
    else:
        ranks = set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
    return tuple(sorted(ranks))


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def make_inputs(n: int, numel: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return [torch.randn(numel, generator=g).to(dtype) for _ in range(n)]
    return [torch.randint(-40, 40, (numel,), generator=g, dtype=dtype) for _ in range(n)]


def changed(t: torch.Tensor, seed: int) -> torch.Tensor:
    """The same tensor with some elements moved (what a user's code change does to an input)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(t.shape, generator=g) < 0.5
    delta = torch.randn(t.shape, generator=g).to(t.dtype) if t.is_floating_point() else torch.randint(1, 9, t.shape, generator=g, dtype=t.dtype)
    return torch.where(mask, t + delta, t)
