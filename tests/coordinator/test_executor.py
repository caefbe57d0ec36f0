"""The CPU collective executor against straightforward torch reference math."""

import pytest
import torch

from prism.coordinator.executor import Arrival, execute, execute_p2p
from prism.core.errors import MismatchError
from prism.rpc import CommHeader, TensorMeta

pytestmark = pytest.mark.timeout(60)

N = 4
RANKS = tuple(range(N))


def arrivals(op, inputs, outputs=None, **kw):
    """inputs[g] / outputs[g]: the tensors of group rank g (outputs as shapes-by-example)."""
    out = []
    for g in range(N):
        outs = outputs[g] if outputs is not None else inputs[g]
        h = CommHeader(rank=g, op_index=0, op=op, group_id="0", group_ranks=RANKS, seq=0,
                       inputs=tuple(TensorMeta.of(t) for t in inputs[g]),
                       outputs=tuple(TensorMeta.of(t) for t in outs), **kw)
        out.append(Arrival(h, list(inputs[g])))
    return out


def rand(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(1, 7, shape, generator=g).to(dtype)


REFERENCE = {
    "sum": lambda xs: torch.stack(xs).sum(0),
    "product": lambda xs: torch.stack(xs).prod(0),
    "min": lambda xs: torch.stack(xs).min(0).values,
    "max": lambda xs: torch.stack(xs).max(0).values,
    "band": lambda xs: xs[0] & xs[1] & xs[2] & xs[3],
    "bor": lambda xs: xs[0] | xs[1] | xs[2] | xs[3],
    "bxor": lambda xs: xs[0] ^ xs[1] ^ xs[2] ^ xs[3],
}

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int64, torch.int32, torch.uint8]


def close(a, b):
    if a.dtype.is_floating_point:
        tol = {torch.bfloat16: 3e-2, torch.float16: 3e-3}.get(a.dtype, 1e-6)
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
def test_all_reduce_matches_reference(dtype, op):
    xs = [rand(dtype, (5, 3), seed=g) for g in range(N)]
    outs = execute(arrivals("all_reduce", [[x] for x in xs], reduce_op=op))
    want = REFERENCE[op]([x.double() if dtype.is_floating_point else x.long() for x in xs]).to(dtype)
    for g in range(N):
        assert outs[g][0].dtype == dtype and outs[g][0].shape == (5, 3)
        close(outs[g][0], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_all_reduce_avg_divides_the_sum(dtype):
    xs = [rand(dtype, (7,), seed=g) for g in range(N)]
    outs = execute(arrivals("all_reduce", [[x] for x in xs], reduce_op="avg"))
    total = torch.stack(xs).sum(0)
    want = total / N if dtype.is_floating_point else torch.div(total, N, rounding_mode="floor")
    close(outs[0][0], want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_reductions(dtype, op):
    xs = [rand(dtype, (9,), seed=g) for g in range(N)]
    outs = execute(arrivals("all_reduce", [[x] for x in xs], reduce_op=op))
    assert torch.equal(outs[2][0], REFERENCE[op](xs))


def test_all_reduce_uses_the_fixed_ring_order_bitwise():
    from prism.nccl_patches.reduction import ring_reduce

    xs = [torch.randn(1001, dtype=torch.bfloat16) for _ in range(N)]
    outs = execute(arrivals("all_reduce", [[x] for x in xs], reduce_op="sum"))
    assert torch.equal(outs[0][0], ring_reduce(xs, "sum"))


def test_coalesced_all_reduce_reduces_each_tensor():
    xs = [[torch.full((2,), g + 1.0), torch.full((3,), 10.0 * g, dtype=torch.float64)] for g in range(N)]
    outs = execute(arrivals("all_reduce", xs, reduce_op="sum", coalesced=True))
    assert torch.equal(outs[1][0], torch.full((2,), 10.0))
    assert torch.equal(outs[1][1], torch.full((3,), 60.0, dtype=torch.float64))


def test_all_gather_list_flat_and_coalesced():
    xs = [torch.arange(3, dtype=torch.int64) + 10 * g for g in range(N)]
    listed = execute(arrivals("all_gather", [[x] for x in xs], [[torch.empty(3)] * N for _ in range(N)]))
    assert all(torch.equal(listed[2][j], xs[j]) for j in range(N))
    flat = execute(arrivals("all_gather", [[x] for x in xs], [[torch.empty(N * 3)] for _ in range(N)], flat=True))
    assert torch.equal(flat[0][0], torch.cat(xs))
    ys = [torch.full((2, 2), float(g), dtype=torch.bfloat16) for g in range(N)]
    co = execute(arrivals("all_gather", [[x, y] for x, y in zip(xs, ys, strict=True)],
                          [[torch.empty(N * 3), torch.empty(N * 2, 2)] for _ in range(N)], flat=True, coalesced=True))
    assert torch.equal(co[3][0], torch.cat(xs)) and torch.equal(co[3][1], torch.cat(ys))
    lc = execute(arrivals("all_gather", [[x, y] for x, y in zip(xs, ys, strict=True)],
                          [[torch.empty(3)] * N + [torch.empty(2, 2)] * N for _ in range(N)], coalesced=True))
    assert torch.equal(lc[1][2], xs[2]) and torch.equal(lc[1][N + 3], ys[3])


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_reduce_scatter_list_and_flat(op):
    full = [torch.randn(N * 5) for _ in range(N)]
    want = {"sum": torch.stack(full).sum(0), "avg": torch.stack(full).sum(0) / N,
            "max": torch.stack(full).max(0).values}[op]
    flat = execute(arrivals("reduce_scatter", [[f] for f in full], [[torch.empty(5)] for _ in range(N)],
                            reduce_op=op, flat=True))
    listed = execute(arrivals("reduce_scatter", [list(f.split(5)) for f in full], [[torch.empty(5)] for _ in range(N)],
                              reduce_op=op))
    for g in range(N):
        close(flat[g][0], want[g * 5:(g + 1) * 5])
        assert torch.equal(flat[g][0], listed[g][0])


def test_reduce_scatter_coalesced():
    a = [torch.randn(N * 2) for _ in range(N)]
    b = [torch.randn(N * 3).double() for _ in range(N)]
    outs = execute(arrivals("reduce_scatter", [[x, y] for x, y in zip(a, b, strict=True)],
                            [[torch.empty(2), torch.empty(3)] for _ in range(N)],
                            reduce_op="sum", flat=True, coalesced=True))
    close(outs[1][0], torch.stack(a).sum(0)[2:4])
    close(outs[1][1], torch.stack(b).sum(0)[3:6])


def test_all_to_all_uneven_splits_and_list_form():
    # rank s sends (s + d) rows of value 100*s + d to rank d
    ins, in_splits, out_splits = [], [], []
    for s in range(N):
        ins.append(torch.cat([torch.full((s + d, 2), 100.0 * s + d) for d in range(N)]))
        in_splits.append(tuple(s + d for d in range(N)))
        out_splits.append(tuple(j + s for j in range(N)))
    arr = []
    for g in range(N):
        rows = sum(out_splits[g])
        h = CommHeader(rank=g, op_index=0, op="all_to_all", group_id="0", group_ranks=RANKS, seq=0, flat=True,
                       in_splits=in_splits[g], out_splits=out_splits[g], inputs=(TensorMeta.of(ins[g]),),
                       outputs=(TensorMeta("float32", (rows, 2)),))
        arr.append(Arrival(h, [ins[g]]))
    outs = execute(arr)
    for d in range(N):
        want = torch.cat([torch.full((s + d, 2), 100.0 * s + d) for s in range(N)])
        assert torch.equal(outs[d][0], want)
    lists = [[torch.tensor([10 * s + d]) for d in range(N)] for s in range(N)]
    lo = execute(arrivals("all_to_all", lists))
    assert [int(t) for t in lo[2]] == [2, 12, 22, 32]


def test_broadcast_reduce_gather_scatter_barrier():
    xs = [torch.full((3,), float(g)) for g in range(N)]
    b = execute(arrivals("broadcast", [[x] for x in xs], root=2))
    assert torch.equal(b[0][0], xs[2]) and b[2] == []
    r = execute(arrivals("reduce", [[x] for x in xs], reduce_op="sum", root=1))
    assert torch.equal(r[1][0], torch.full((3,), 6.0)) and r[0] == [] and r[3] == []
    ga = execute(arrivals("gather", [[x] for x in xs], [[torch.empty(3)] * N for _ in range(N)], root=3))
    assert all(torch.equal(ga[3][j], xs[j]) for j in range(N)) and ga[0] == []
    sc_in = [[] for _ in range(N)]
    sc_in[0] = [torch.tensor([7 * g]) for g in range(N)]
    sc = execute(arrivals("scatter", sc_in, [[torch.empty(1)] for _ in range(N)], root=0))
    assert [int(sc[g][0]) for g in range(N)] == [0, 7, 14, 21]
    assert execute(arrivals("barrier", [[] for _ in range(N)])) == [[] for _ in range(N)]


def test_send_recv_pair():
    t = torch.arange(6, dtype=torch.int32).view(2, 3)
    send = Arrival(CommHeader(rank=0, op_index=0, op="send", group_id="0", group_ranks=RANKS, seq=0, peer=1,
                              inputs=(TensorMeta.of(t),)), [t])
    recv = CommHeader(rank=1, op_index=0, op="recv", group_id="0", group_ranks=RANKS, seq=0, peer=0,
                      outputs=(TensorMeta("int32", (2, 3)),))
    assert torch.equal(execute_p2p(send, recv)[0], t)
    wrong = CommHeader(rank=1, op_index=0, op="recv", group_id="0", group_ranks=RANKS, seq=0, peer=0,
                       outputs=(TensorMeta("float32", (2, 3)),), call_site="train.py:9")
    with pytest.raises(MismatchError, match="receiver expects"):
        execute_p2p(send, wrong)


def test_size_disagreement_names_the_ranks():
    xs = [torch.ones(4) for _ in range(N)]
    xs[3] = torch.ones(5)
    with pytest.raises(MismatchError, match=r"rank 3: \(5,\)"):
        execute(arrivals("all_reduce", [[x] for x in xs], reduce_op="sum"))
