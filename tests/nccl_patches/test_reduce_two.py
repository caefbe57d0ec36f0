"""A pair's reduction in one op gives the ring's bits (prism.nccl_patches.reduction.reduce_two)."""

import pytest
import torch

from prism.nccl_patches.reduction import REDUCE_OPS, reduce_two, ring_reduce

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.complex64)


def _operands(dtype: torch.dtype, numel: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(numel, dtype=dtype, generator=g), torch.randn(numel, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return ((torch.randn(numel, generator=g) * 100).to(dtype), (torch.randn(numel, generator=g) * 100).to(dtype))
    return (torch.randint(0, 100, (numel,), generator=g, dtype=dtype),
            torch.randint(0, 100, (numel,), generator=g, dtype=dtype))


def _applies(op: str, dtype: torch.dtype) -> bool:
    if op == "premul_sum":
        return False
    if op in ("band", "bor", "bxor"):
        return not (dtype.is_floating_point or dtype.is_complex)
    return not (op in ("min", "max") and dtype.is_complex)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("numel", [1, 2, 7, 1001, 100_003])
def test_two_operands_reduce_to_the_rings_bits_in_one_op(dtype, numel):
    a, b = _operands(dtype, numel, seed=numel)
    for op in (op for op in REDUCE_OPS if _applies(op, dtype)):
        ring = ring_reduce([a, b], op)
        assert torch.equal(reduce_two(a, b, op), ring), op
        out = torch.empty_like(a)
        assert reduce_two(a, b, op, out=out) is out and torch.equal(out, ring), op


def test_the_result_can_overwrite_the_first_operand():
    a, b = _operands(torch.float32, 513, seed=1)
    ring = ring_reduce([a, b], "avg")
    assert torch.equal(reduce_two(a, b, "avg", out=a), ring) and torch.equal(a, ring)


def test_premul_sum_has_no_two_operand_form():
    a, b = _operands(torch.float32, 4, seed=2)
    with pytest.raises(AssertionError, match="premul_sum needs one factor per rank"):
        reduce_two(a, b, "premul_sum")
