"""Pruned collectives across real processes over a real gloo transport.

Each example starts one process per sandbox rank and one or two vrank endpoints, and runs ring
all-reduce (unchanged and changed inputs), tree all-reduce, ring reduce-scatter, ring all-gather,
chain broadcast, uneven all-to-all and send/recv in sequence on one transport.
"""

import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prism.nccl_patches.compensation import record_for_sandbox
from prism.nccl_patches.reduction import chunk_bounds, ring_reduce
from prism.nccl_patches.schedule import Algo, Geometry, full_schedule, link_traffic
from tests.nccl_patches import endpoint_worker
from tests.nccl_patches.cases import changed, make_inputs

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def plan_jobs(n, sandbox, dtype, seed):
    """(job, expected output per sandbox rank, full-algorithm geometry) for each collective."""
    numel = 3 * n + 1
    x = make_inputs(n, numel, dtype, seed)
    moved = [changed(t, seed + r) if r == sandbox[0] else t for r, t in enumerate(x)]
    rs_in = make_inputs(n, 2 * n, dtype, seed + 1)
    g = torch.Generator().manual_seed(seed)
    splits = torch.randint(0, 3, (n, n), generator=g).tolist()
    a2a_in = [make_inputs(1, 2 * sum(splits[i]), dtype, seed + 7 + i)[0].view(-1, 2) for i in range(n)]
    root, src = seed % n, (seed // 7) % n
    dst = sandbox[-1] if src != sandbox[-1] else sandbox[0]
    if dst == src:
        dst = (src + 1) % n
    jobs, expected, geometries = [], [], []

    def add(algo, inputs, data, want, geometry, reduce_op="", kwargs=None, **rec_kw):
        rec = record_for_sandbox(inputs, algo, reduce_op, sandbox, **rec_kw)
        jobs.append({"recorded": rec, "data": {s: data[s] for s in sandbox},
                     "kwargs": {s: {"reduce_op": reduce_op, **(kwargs(s) if kwargs else {})} for s in sandbox}})
        expected.append(want)
        geometries.append((algo, geometry))

    full = ring_reduce(x, "sum")
    add(Algo.RING_ALL_REDUCE, x, x, dict.fromkeys(sandbox, full), Geometry(n, numel), "sum")
    add(Algo.RING_ALL_REDUCE, x, moved, dict.fromkeys(sandbox, ring_reduce(moved, "sum")), Geometry(n, numel), "sum")
    add(Algo.TREE_ALL_REDUCE, x, x, dict.fromkeys(sandbox, ring_reduce(x, "max")), Geometry(n, numel), "max")
    rs = ring_reduce(rs_in, "avg")
    bounds = chunk_bounds(2 * n, n)
    add(Algo.RING_REDUCE_SCATTER, rs_in, rs_in, {s: rs[bounds[s][0] : bounds[s][1]] for s in sandbox}, Geometry(n, 2 * n), "avg")
    add(Algo.RING_ALL_GATHER, x, x, dict.fromkeys(sandbox, torch.cat(x)), Geometry(n, numel))
    add(Algo.CHAIN_BROADCAST, x, x, dict.fromkeys(sandbox, x[root]), Geometry(n, numel, root=root), root=root,
        kwargs=lambda s: {"root": root})
    a2a_out = {s: torch.cat([a2a_in[i].reshape(-1)[2 * sum(splits[i][:s]) : 2 * sum(splits[i][: s + 1])] for i in range(n)])
               for s in sandbox}
    add(Algo.DIRECT_ALL_TO_ALL, a2a_in, a2a_in, a2a_out, Geometry(n, block_numel=lambda a, b: 2 * splits[a][b]),
        in_splits=splits, kwargs=lambda s: {"in_splits": splits[s], "out_splits": [splits[i][s] for i in range(n)]})
    add(Algo.P2P, x, x, {s: (x[src] if s == dst else None) for s in sandbox}, Geometry(n, numel, root=src, peer=dst),
        root=src, peer=dst, kwargs=lambda s: {"root": src, "peer": dst})
    return jobs, expected, geometries


def run_endpoints(tmp_path, plan):
    ctx = multiprocessing.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.save(plan, tmp_path / "plan.pt")
    outs = [str(tmp_path / f"endpoint-{e}.pt") for e in range(plan["num_endpoints"])]
    procs = [ctx.Process(target=endpoint_worker.main, args=(str(tmp_path / "plan.pt"), e, store.port, outs[e]))
             for e in range(plan["num_endpoints"])]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 600
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        errors = [open(o + ".error").read() for o in outs if (tmp_path / (o.rsplit("/", 1)[1] + ".error")).exists()]
        assert not errors, errors[0]
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    return [torch.load(o, weights_only=False) for o in outs]


@given(
    n=st.integers(2, 16),
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]),
    seed=st.integers(0, 10**6),
)
@example(n=12, data=None, dtype=torch.float32, seed=3).via("several blocks")
@settings(max_examples=2, deadline=None, derandomize=True)  # the same examples on every CI run
def test_sandbox_outputs_and_link_traffic_over_real_gloo(tmp_path_factory, n, data, dtype, seed):
    if data is None:  # the explicit example: two separated blocks, one of them of two ranks
        sandbox, num_vrank_endpoints = (2, 3, 8), 1
    else:
        sandbox = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(3, n)))))
        num_vrank_endpoints = data.draw(st.integers(1, 4 - len(sandbox))) if len(sandbox) < 4 else 1
    if len(sandbox) == n:
        num_vrank_endpoints = 0
    tmp_path = tmp_path_factory.mktemp("pruned")
    jobs, expected, geometries = plan_jobs(n, sandbox, dtype, seed)
    endpoint_of = {s: i for i, s in enumerate(sandbox)}
    for r in range(n):
        if r not in endpoint_of and num_vrank_endpoints:
            endpoint_of[r] = len(sandbox) + r % num_vrank_endpoints
    plan = {"n": n, "sandbox": sandbox, "num_endpoints": len(sandbox) + num_vrank_endpoints,
            "endpoint_of": endpoint_of, "jobs": jobs}
    results = run_endpoints(tmp_path, plan)
    for i, (algo, geometry) in enumerate(geometries):
        real = link_traffic(full_schedule(algo, geometry), torch.tensor([], dtype=dtype).element_size())
        for e, s in enumerate(sandbox):
            got, want = results[e][i]["output"], expected[i][s]
            if want is None:
                assert got is None
            elif i == 1 and dtype.is_floating_point:
                # changed input: recorded + Δ, within rounding -- when one endpoint hosts every vrank
                # of the group; with several, a deviation is not carried across endpoints
                # (docs/pruned-collectives.md), so there is no value to compare with.
                if num_vrank_endpoints <= 1:
                    assert torch.allclose(got.double(), want.double(), atol=0.1 * n, rtol=0.05), (algo, s)
            else:
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (i, algo, s)
            assert results[e][i].get("diverged") == (i == 1 and s == sandbox[0] and not torch.equal(
                jobs[1]["data"][s], jobs[0]["data"][s]))
            # every link of this sandbox rank carried exactly what the full algorithm sends on it
            assert results[e][i]["traffic"] == {k: v for k, v in real.items() if s in k}, (algo, s)
        for e in range(len(sandbox), plan["num_endpoints"]):
            hosted = {r for r, ep in endpoint_of.items() if ep == e}
            want_links = {k: v for k, v in real.items() if set(k) & set(sandbox) and set(k) & hosted}
            assert results[e][i]["traffic"] == want_links, (algo, e)
