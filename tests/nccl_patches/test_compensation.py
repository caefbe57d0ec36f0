"""Pruned collectives in one process: sandbox parties with real data, neighbor parties with
compensated chunks, messages delivered in memory in the real step order.

The collector's outputs are :func:`ring_reduce` (prism's fixed order). Unchanged sandbox inputs
must give them bit for bit; changed inputs give recorded + Δ (ops with an inverse) or the documented
result (min/max/product/band/bor).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core.errors import PrismError
from prism.nccl_patches.compensation import bits_equal, host_bytes, record_for_sandbox, same_bits, same_bits_as
from prism.nccl_patches.parties import NeighborParty, SandboxParty
from prism.nccl_patches.pruned import neighbor_ranks, run_in_process
from prism.nccl_patches.reduction import chunk_bounds, reduce_chunk, ring_order, ring_reduce
from prism.nccl_patches.schedule import Algo, Geometry, full_schedule, link_traffic, steps_touching
from prism.nccl_patches.vplan import p2p_tag, p2p_tag_base
from tests.nccl_patches.cases import DTYPES, changed, make_inputs, ops_for, sandbox_subsets

pytestmark = pytest.mark.timeout(300)

REDUCTIONS = [Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER, Algo.TREE_ALL_REDUCE]


def split(ranks, k):
    ranks = sorted(ranks)
    return [ranks[i::k] for i in range(k) if ranks[i::k]]


def run(algo, inputs, actual, sandbox, *, reduce_op="", endpoints=1, premul=None, root=0, peer=-1, in_splits=None):
    """Record from ``inputs``, then emulate with the sandbox ranks holding ``actual``."""
    n = len(inputs)
    rec = record_for_sandbox(inputs, algo, reduce_op, sandbox, root=root, peer=peer, premul=premul, in_splits=in_splits)
    parties = {
        s: SandboxParty(
            algo, s, actual[s], group_size=n, reduce_op=reduce_op, root=root, peer=peer,
            premul=premul[s] if premul else None,
            in_splits=in_splits[s] if in_splits else None,
            out_splits=[in_splits[i][s] for i in range(n)] if in_splits else None,
            recorded=rec,
        )
        for s in sandbox
    }
    neighbors = [NeighborParty(rec, hosted) for hosted in split(neighbor_ranks(rec), endpoints)]
    traffic = run_in_process([*parties.values(), *neighbors])
    return rec, parties, traffic


def real_traffic(algo, geometry, sandbox, itemsize):
    full = link_traffic(full_schedule(algo, geometry), itemsize)
    return {link: t for link, t in full.items() if set(link) & set(sandbox)}


def collected(algo, inputs, reduce_op, premul, rank):
    full = ring_reduce(inputs, reduce_op, premul=premul)
    if algo is Algo.RING_REDUCE_SCATTER:
        lo, hi = chunk_bounds(full.numel(), len(inputs))[rank]
        return full[lo:hi]
    return full


@st.composite
def reduction_cases(draw, ops=None):
    n = draw(st.integers(2, 64))
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from([o for o in ops_for(dtype) if ops is None or o in ops]))
    algo = draw(st.sampled_from(REDUCTIONS))
    numel = n * draw(st.integers(1, 3)) if algo is Algo.RING_REDUCE_SCATTER else draw(st.integers(1, 2 * n + 3))
    premul = [0.5 + (r % 7) / 4 for r in range(n)] if op == "premul_sum" else None
    return algo, n, dtype, op, numel, premul, draw(sandbox_subsets(n)), draw(st.integers(0, 10**6))


@given(reduction_cases(), st.integers(1, 3))
@settings(max_examples=120, deadline=None)
def test_unchanged_inputs_give_the_collected_outputs_bit_for_bit(case, endpoints):
    algo, n, dtype, op, numel, premul, sandbox, seed = case
    inputs = make_inputs(n, numel, dtype, seed)
    rec, parties, traffic = run(algo, inputs, inputs, sandbox, reduce_op=op, endpoints=endpoints, premul=premul)
    for s, party in parties.items():
        assert torch.equal(party.output().view(torch.uint8), collected(algo, inputs, op, premul, s).view(torch.uint8)), s
        assert not party.diverged
    itemsize = inputs[0].element_size()
    assert traffic == real_traffic(algo, Geometry(n, numel=numel), sandbox, itemsize)


def tolerance(inputs, actual, premul, op, dtype):
    """An elementwise bound on the rounding of two different summation paths."""
    n = len(inputs)
    eps = torch.finfo(dtype).eps
    scale = torch.tensor(premul, dtype=torch.float64)[:, None] if premul else 1.0
    mags = (torch.stack([t.double() for t in inputs]).abs() + torch.stack([t.double() for t in actual]).abs()) * scale
    bound = (n + 4) * eps * mags.sum(0)
    return bound / n if op == "avg" else bound


@given(reduction_cases(ops=("sum", "avg", "premul_sum", "bxor")), st.data())
@settings(max_examples=100, deadline=None)
def test_changed_inputs_give_recorded_plus_delta_on_every_element(case, data):
    algo, n, dtype, op, numel, premul, sandbox, seed = case
    inputs = make_inputs(n, numel, dtype, seed)
    movers = data.draw(st.lists(st.sampled_from(sandbox), min_size=1, unique=True))
    actual = [changed(t, seed + r) if r in movers else t for r, t in enumerate(inputs)]
    rec, parties, traffic = run(algo, inputs, actual, sandbox, reduce_op=op, premul=premul)
    for s, party in parties.items():
        got, want = party.output(), collected(algo, actual, op, premul, s)
        assert party.diverged == (not torch.equal(actual[s], inputs[s]))
        if dtype.is_floating_point:
            lo, hi = (chunk_bounds(numel, n)[s] if algo is Algo.RING_REDUCE_SCATTER else (0, numel))
            bound = tolerance([t[lo:hi] for t in inputs], [t[lo:hi] for t in actual], premul, op, dtype)
            assert ((got.double() - want.double()).abs() <= bound).all(), (s, got, want)
        elif op == "avg":  # integer average: truncated deviation, within one
            assert ((got - want).abs() <= 1).all()
        else:  # integer sum and bxor are exact
            assert torch.equal(got, want)
    assert traffic == real_traffic(algo, Geometry(n, numel=numel), sandbox, inputs[0].element_size())


def test_one_sandbox_rank_of_eight_sees_its_own_gradient_change_everywhere():
    inputs = [torch.full((8,), float(r)) for r in range(8)]  # every rank contributes its rank
    actual = list(inputs)
    actual[3] = torch.full((8,), 103.0)  # rank 3's code now contributes 100 more
    rec, parties, traffic = run(Algo.RING_ALL_REDUCE, inputs, actual, [3], reduce_op="sum")
    assert rec.outputs[3].tolist() == [28.0] * 8
    assert parties[3].output().tolist() == [128.0] * 8
    assert parties[3].diverged
    assert set(traffic) == {(2, 3), (3, 4)}  # only the links of rank 3 exist
    assert traffic[(2, 3)].num_steps == 14 and traffic[(2, 3)].num_bytes == 4 * (8 - 1 + 8 - 1)


@st.composite
def no_inverse_cases(draw):
    n = draw(st.integers(2, 40))
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from([o for o in ops_for(dtype) if o in ("min", "max", "product", "band", "bor")]))
    algo = draw(st.sampled_from([Algo.RING_ALL_REDUCE, Algo.RING_REDUCE_SCATTER]))
    numel = n * draw(st.integers(1, 2))
    return algo, n, dtype, op, numel, draw(sandbox_subsets(n)), draw(st.integers(0, 10**6))


@given(no_inverse_cases())
@settings(max_examples=80, deadline=None)
def test_changed_inputs_without_inverse_reduce_the_owners_block_for_real_on_the_recorded_prefix(case):
    """min/max/product/band/bor: a sandbox owner's chunk folds the real inputs of the sandbox ranks
    just before it on the chunk's path onto the recorded prefix; chunks owned by vranks stay
    recorded."""
    algo, n, dtype, op, numel, sandbox, seed = case
    inputs = make_inputs(n, numel, dtype, seed)
    actual = [changed(t, seed + r) if r in sandbox else t for r, t in enumerate(inputs)]
    rec, parties, _ = run(algo, inputs, actual, sandbox, reduce_op=op)
    bounds = chunk_bounds(numel, n)
    recorded_full = ring_reduce(inputs, op)
    expected = recorded_full.clone()
    for c in sandbox:
        order = ring_order(c, n)
        j = n - 1
        while j > 0 and order[j - 1] in sandbox:
            j -= 1
        mixed = [actual[r] if r in order[j:] else inputs[r] for r in range(n)]
        lo, hi = bounds[c]
        expected[lo:hi] = reduce_chunk([t[lo:hi] for t in mixed], c, op)
    for s, party in parties.items():
        want = expected if algo is Algo.RING_ALL_REDUCE else expected[bounds[s][0] : bounds[s][1]]
        assert torch.equal(party.output(), want), s


@pytest.mark.parametrize("op", ["min", "max", "band", "bor"])
def test_tree_root_in_the_sandbox_reduces_its_change_for_real(op):
    dtype = torch.int64 if op in ("band", "bor") else torch.float32
    inputs = make_inputs(11, 9, dtype, seed=5)
    actual = list(inputs)
    actual[0] = changed(inputs[0], 6)
    _, parties, _ = run(Algo.TREE_ALL_REDUCE, inputs, actual, [0, 2], reduce_op=op)
    assert torch.equal(parties[0].output(), ring_reduce(actual, op))
    assert torch.equal(parties[2].output(), ring_reduce(actual, op))  # from its sandbox parent


def test_tree_leaf_under_a_virtual_root_keeps_the_recorded_value_for_max():
    inputs = make_inputs(7, 5, torch.float32, seed=1)
    actual = list(inputs)
    actual[5] = inputs[5] + 100  # would become the max everywhere
    rec, parties, _ = run(Algo.TREE_ALL_REDUCE, inputs, actual, [5], reduce_op="max")
    assert torch.equal(parties[5].output(), rec.outputs[5])
    assert parties[5].diverged


# ---------------------------------------------------------------------------- data movement


@st.composite
def movement_cases(draw):
    n = draw(st.integers(2, 48))
    return (
        draw(st.sampled_from([Algo.RING_ALL_GATHER, Algo.CHAIN_BROADCAST, Algo.DIRECT_ALL_TO_ALL, Algo.P2P])),
        n,
        draw(st.sampled_from(DTYPES)),
        draw(sandbox_subsets(n)),
        draw(st.integers(0, n - 1)),
        draw(st.integers(1, n - 1)),
        draw(st.booleans()),
        draw(st.integers(0, 10**6)),
    )


@given(movement_cases(), st.integers(1, 2))
@settings(max_examples=100, deadline=None)
def test_gather_broadcast_all_to_all_and_p2p_deliver_recorded_values_and_real_sandbox_data(case, endpoints):
    algo, n, dtype, sandbox, root, hop, change, seed = case
    peer = (root + hop) % n
    g = torch.Generator().manual_seed(seed)
    in_splits = None
    if algo is Algo.DIRECT_ALL_TO_ALL:  # uneven splits, rows of 3 elements
        in_splits = torch.randint(0, 3, (n, n), generator=g).tolist()
        inputs = [make_inputs(1, 3 * sum(in_splits[i]), dtype, seed + i)[0].view(-1, 3) for i in range(n)]
    else:
        inputs = make_inputs(n, 1 + seed % 5, dtype, seed)
    actual = [changed(t, seed + r) if change and r in sandbox else t for r, t in enumerate(inputs)]
    single = endpoints == 1
    rec, parties, traffic = run(algo, inputs, actual, sandbox, root=root, peer=peer, endpoints=endpoints, in_splits=in_splits)
    flat = [t.reshape(-1) for t in inputs]
    real = [t.reshape(-1) for t in actual]
    for s, party in parties.items():
        got = party.output()
        if algo is Algo.RING_ALL_GATHER:
            # every sandbox rank's real piece reaches every sandbox rank (through one endpoint)
            want = torch.cat([real[r] if r in sandbox and (single or r == s) else flat[r] for r in range(n)])
            if single or not change:
                assert torch.equal(got, want)
            else:
                assert torch.equal(got[s * flat[0].numel() : (s + 1) * flat[0].numel()], real[s])
        elif algo is Algo.CHAIN_BROADCAST:
            want = real[root] if root in sandbox else flat[root]
            if single or not change or s == root:
                assert torch.equal(got, want)
        elif algo is Algo.P2P:
            if s == peer:
                assert torch.equal(got, real[root] if root in sandbox else flat[root])
            else:
                assert got is None
        else:
            offs = [[3 * sum(in_splits[i][:j]) for j in range(n + 1)] for i in range(n)]
            src = [real[i] if i in sandbox else flat[i] for i in range(n)]
            assert torch.equal(got, torch.cat([src[i][offs[i][s] : offs[i][s + 1]] for i in range(n)]))
    numel = flat[0].numel()
    geometry = Geometry(n, numel=numel, root=root, peer=peer,
                        block_numel=(lambda a, b: 3 * in_splits[a][b]) if in_splits else None)
    assert traffic == real_traffic(algo, geometry, sandbox, inputs[0].element_size())


# ----------------------------------------------------------------------------------- errors


def test_a_vrank_endpoint_cannot_host_a_sandbox_rank():
    rec = record_for_sandbox([torch.ones(4)] * 4, Algo.RING_ALL_REDUCE, "sum", [1])
    with pytest.raises(PrismError, match=r"ranks \[1\] are sandbox ranks"):
        NeighborParty(rec, [0, 1, 2])


def test_a_missing_neighbor_endpoint_is_named():
    inputs = [torch.ones(4)] * 4
    rec = record_for_sandbox(inputs, Algo.RING_ALL_REDUCE, "sum", [1])
    parties = [SandboxParty(Algo.RING_ALL_REDUCE, 1, inputs[1], group_size=4, reduce_op="sum"), NeighborParty(rec, [0])]
    with pytest.raises(PrismError, match="has no party for group rank 2"):
        run_in_process(parties)


def test_recording_needs_a_sandbox_rank_and_a_known_reduce_op():
    with pytest.raises(PrismError, match="no sandbox rank"):
        record_for_sandbox([torch.ones(2)] * 2, Algo.RING_ALL_REDUCE, "sum", [])
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        record_for_sandbox([torch.ones(2)] * 2, Algo.RING_ALL_REDUCE, "mean", [0])


@pytest.mark.parametrize(("seq", "part", "n", "src", "dst"), [(0, 0, 2, 0, 1), (17, 1, 16, 5, 3), (40, 0, 8, 7, 0)])
def test_a_message_posted_directly_carries_the_tag_of_its_p2p_step(seq, part, n, src, dst):
    # The live engine posts send/recv without the step machine; the replayer's side runs it.
    (step,) = steps_touching(Algo.P2P, Geometry(n, 8, src, dst), [src])
    assert p2p_tag(seq, part, n, src, dst) == p2p_tag_base(seq, part, n, src) + step.tag(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.bool])
@pytest.mark.parametrize("numel", [100, 40_000])  # torch.equal below 32 KiB, NumPy from there on
def test_same_bits_is_bitwise_equality_of_every_element(dtype, numel):
    base = (torch.arange(-numel // 2, numel - numel // 2) % 7).to(dtype)
    assert same_bits(base, base.clone())
    assert same_bits(base.reshape(10, numel // 10), base.clone())  # shapes differ, elements do not
    other = base.clone()
    other[numel - 37] = ~other[numel - 37] if dtype is torch.bool else other[numel - 37] + 1
    assert not same_bits(other, base)
    assert bool(bits_equal(other, base).all()) == same_bits(other, base)
    if dtype.is_floating_point:  # a message that requires grad (a pipeline's activation)
        leaf = base.clone().requires_grad_()
        assert same_bits(leaf, base) and not same_bits(leaf, other)


def test_same_bits_tells_signed_zeros_and_nan_payloads_apart_as_bits_equal_does():
    zeros, neg = torch.zeros(4), torch.tensor([0.0, -0.0, 0.0, 0.0])
    assert not same_bits(neg, zeros)
    nan = torch.full((4,), float("nan"))
    assert same_bits(nan, nan.clone())
    payload = nan.clone()
    payload.view(torch.int32)[2] += 1  # still a NaN, another bit pattern
    assert torch.isnan(payload).all() and not same_bits(payload, nan)
    assert same_bits(torch.empty(0), torch.empty(0))
    with pytest.raises(PrismError, match=r"float64\[4\] but the recorded one is float32\[4\]"):
        same_bits(zeros.double(), zeros)


def test_same_bits_compares_values_where_memory_is_not_the_values():
    # Small host tensors are compared as bytes; a view whose memory is another order of its
    # values, an offset into a storage, or a lazily conjugated tensor must still compare values.
    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert same_bits(grid.t(), grid.t().contiguous())
    assert not same_bits(grid.t(), grid.reshape(4, 3))  # the same memory, other values
    line = torch.arange(20, dtype=torch.float32)
    assert same_bits(line[10:], torch.arange(10, 20, dtype=torch.float32))
    assert not same_bits(line[:10], torch.arange(10, 20, dtype=torch.float32))
    c = torch.tensor([1 + 2j, 3 - 1j])
    assert same_bits(c.conj(), c.conj().resolve_conj()) and not same_bits(c.conj(), c)


def test_bytes_kept_at_a_send_compare_later_as_same_bits_would():
    # A small send's bytes are copied at its post and compared with the record later.
    sent = torch.tensor([0.0, -0.0, float("nan"), 3.5])
    data = host_bytes(sent)
    assert data is not None and len(data) == 16
    sent += 1  # the script may reuse the tensor after its wait; the copy is what was sent
    recorded = torch.tensor([0.0, -0.0, float("nan"), 3.5])
    assert same_bits_as(data, torch.float32, 4, recorded)
    assert same_bits_as(data, torch.float32, 4, torch.stack([recorded, recorded], 1)[:, 0])  # strided record
    assert not same_bits_as(data, torch.float32, 4, torch.tensor([0.0, 0.0, float("nan"), 3.5]))  # -0.0
    assert not same_bits_as(data, torch.float32, 4, recorded.double())  # another dtype: a divergence
    assert not same_bits_as(data, torch.float32, 4, recorded[:3])
    assert host_bytes(torch.arange(6.0).reshape(2, 3).t()) is None  # strided: checked at the wait
    assert host_bytes(torch.zeros(40_000)) is None  # large: checked at the wait


@pytest.mark.parametrize("algo", [Algo.RING_ALL_REDUCE, Algo.RING_ALL_GATHER])
@pytest.mark.parametrize("numel", [3, 37])
@pytest.mark.parametrize("sandbox", [(1,), (0, 1, 2), (2, 3, 5)])
def test_a_ring_built_in_the_output_buffer_gives_the_same_bits_there(algo, numel, sandbox):
    n = 6
    reduce_op = "sum" if algo is Algo.RING_ALL_REDUCE else ""
    inputs = [torch.randn(numel, generator=torch.Generator().manual_seed(r)) for r in range(n)]
    actual = [t + 1 if r == sandbox[-1] else t.clone() for r, t in enumerate(inputs)]  # one rank diverges
    rec = record_for_sandbox(inputs, algo, reduce_op, sandbox)

    def run_ring(in_place):
        parties, buffers = {}, {}
        for s in sandbox:
            data = actual[s].clone()
            if in_place:  # all-reduce: the input itself; all-gather: an output holding garbage
                buffers[s] = data if algo is Algo.RING_ALL_REDUCE else torch.full((n * numel,), float("nan"))
            parties[s] = SandboxParty(algo, s, data, group_size=n, reduce_op=reduce_op, recorded=rec,
                                      out=buffers.get(s))
        run_in_process([*parties.values(), NeighborParty(rec, neighbor_ranks(rec))])
        for s, p in parties.items():  # checked on the input as given, before the result replaced it
            assert p.diverged == (s == sandbox[-1]), f"rank {s}"
        return {s: p.output() for s, p in parties.items()}, buffers

    copied, _ = run_ring(False)
    built, buffers = run_ring(True)
    for s in sandbox:
        assert built[s] is buffers[s], f"rank {s}: the result is not the given buffer"
        assert bool(bits_equal(built[s], copied[s]).all()), f"rank {s}: another result in place"
        if algo is Algo.RING_ALL_GATHER:
            assert bool(bits_equal(built[s], torch.cat(actual)).all()), f"rank {s}"
