"""The CPU lanes path's transfer hold: a delegated collective's outputs wait for what the whole
group's algorithm takes after its last member arrived, less the lane's own two messages
(prism/nccl_patches/linkmodel.py, docs/emulate.md "What a delegated op's duration leaves out")."""

import pytest
import torch

from prism.graph.records import CommOp, Node, NodeKind
from prism.nccl_patches import Algo, record_for_sandbox
from prism.nccl_patches.linkmodel import LinkModel
from prism.nccl_patches.vplan import Lane
from prism.graph import parse_graph
from prism.vrank_replayer.clock import AsapClock, CoSimClock, TimedClock
from prism.vrank_replayer.device_serve import DeviceServer
from prism.vrank_replayer.plan import Channel

LINK = LinkModel(latency_ns=50_000, ns_per_byte=1.0)


def _server(sandbox: frozenset[int], clock=None) -> DeviceServer:
    return DeviceServer(index=0, device_index=-1, lanes=[], sandbox=sandbox, store_factory=None,
                        timeout_s=10, clock=clock or AsapClock(), records=None)


def _hold_ns(algo: Algo, n: int, numel: int, sandbox_rank: int, clock=None, group: str = "g") -> float:
    members = tuple(range(10, 10 + n)) if clock is None else tuple(range(n))  # global ranks differ from group ranks
    server = _server(frozenset({members[sandbox_rank]}), clock)
    node = Node(rank=members[sandbox_rank], index=0, kind=NodeKind.COLLECTIVE, op=CommOp.ALL_REDUCE,
                group_id=group, seq=0)
    ch = Channel(group, members, (node,))
    server.links[Lane(group, members[sandbox_rank])] = LINK
    inputs = [torch.ones(numel) for _ in range(n)]
    rec = record_for_sandbox(inputs, algo, "sum", [sandbox_rank])
    received = {(0, sandbox_rank): torch.ones(numel)}
    outputs = {(0, sandbox_rank): torch.ones(numel)}
    return server._transfer_hold_s(ch, node, [rec], [sandbox_rank], received, outputs) * 1e9


def test_a_ring_all_reduce_holds_its_2n_minus_2_steps_less_the_lanes_two_messages():
    # W=8, 4096 float32: 14 steps of one 512-element chunk; the lane moved 4096 elements each way.
    want = 14 * (50_000 + 512 * 4) - 2 * (50_000 + 4096 * 4)
    assert _hold_ns(Algo.RING_ALL_REDUCE, 8, 4096, 2) == pytest.approx(want)


def test_a_ring_of_two_holds_nothing_more_than_the_lane_takes():
    # Two ranks: the ring's two steps of half the tensor are no longer than the lane's round trip.
    assert _hold_ns(Algo.RING_ALL_REDUCE, 2, 4096, 1) == 0.0


def test_no_link_measured_no_hold():
    server = _server(frozenset({0}))
    node = Node(rank=0, index=0, kind=NodeKind.COLLECTIVE, op=CommOp.ALL_REDUCE, group_id="g", seq=0)
    ch = Channel("g", (0, 1, 2, 3), (node,))
    rec = record_for_sandbox([torch.ones(8)] * 4, Algo.RING_ALL_REDUCE, "sum", [0])
    assert server._transfer_hold_s(ch, node, [rec], [0], {}, {}) == 0.0


TIMED = """\
graph world_size=4 kind=timed job_name=t
group 0 ranks=0,1,2,3
r0#0 COLL all_reduce g0:0 16KiB f32[4096] sum step=0 t=0+600000
r1#0 COLL all_reduce g0:0 16KiB f32[4096] sum step=0 t=0+900000
r2#0 COLL all_reduce g0:0 16KiB f32[4096] sum step=0 t=0+700000
r3#0 COLL all_reduce g0:0 16KiB f32[4096] sum step=0 t=0+800000
"""


@pytest.mark.parametrize("clock_kind", ["cosim", "timed"])
def test_an_emulation_holds_for_the_timed_graphs_transfer_not_the_links_model(clock_kind):
    # The instance's transfer in the timed graph is its members' shortest duration, 600 us; the
    # emulation follows it (what the calibration measured), whatever the lane's probe says now.
    timed = parse_graph(TIMED)
    clock = CoSimClock(timed, {0}) if clock_kind == "cosim" else TimedClock(timed, {0})
    want = 600_000 - 2 * (50_000 + 4096 * 4)
    assert _hold_ns(Algo.RING_ALL_REDUCE, 4, 4096, 0, clock=clock, group="0") == pytest.approx(want)


@pytest.mark.timeout(600)
def test_a_lanes_emulation_holds_each_collective_of_a_group_of_four_for_its_transfer(tmp_path):
    # collect_ops4: every collective kind on the world group of 4; rank 1 real on the lanes path.
    import dataclasses
    import json
    import pickle

    from prism.coordinator import CollectOptions, collect_job
    from prism.core.config import ValuesPolicy, load_job
    from prism.core.workerspec import record_path
    from prism.nccl_patches.schedule import Geometry, critical_path
    from prism.vrank_replayer import EmulateOptions, emulate
    from prism.vrank_replayer.replayer import replayer_result_path
    from tests.conftest import ASSETS

    job = load_job(ASSETS / "jobs" / "collect_ops4" / "job.yaml")
    job = dataclasses.replace(job, values=ValuesPolicy(ranks="1"))
    collected = collect_job(job, tmp_path / "run", CollectOptions(slots=2, timeout_s=300)).graph
    result = emulate(tmp_path / "run", EmulateOptions(ranks=(1,), timeout_s=240, device_path="lanes"))
    assert result.ranks[1].num_ops == len(collected.comm_nodes(1))
    assert result.ranks[1].diverged_ops == ()
    assert result.replayers[0].num_transfer_holds > 0

    links = json.loads(replayer_result_path(result.out_dir, 0).read_text())["links"]
    (world_lane,) = [m for prefix, m in links.items() if prefix == "prism/lane/0/c/1"]
    link = LinkModel(world_lane["latency_us"] * 1e3, world_lane["ns_per_byte"])
    with record_path(result.out_dir, 1).open("rb") as f:
        emulated = pickle.load(f)  # noqa: S301 - our own worker's output
    grads = [n for n in emulated.nodes if n.kind is NodeKind.COLLECTIVE and n.group_id == "0"
             and n.op is CommOp.ALL_REDUCE and n.dtype == "f32"]  # the 8-float gradient, each step
    assert grads
    for n in grads:  # one send out, one receive back, the ring of four in between
        ring = link.path_ns(critical_path(Algo.RING_ALL_REDUCE, Geometry(4, 8), 1), 4)
        hold = ring - 2 * link.message_ns(8 * 4)
        assert hold > 0
        assert n.duration_ns >= 0.95 * hold, (n.duration_ns, hold)
