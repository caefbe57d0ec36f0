"""The CPU ``lanes`` path completes a delegated op asynchronously, as gloo completes an async op:
``submit`` returns once the transfers are posted, the script runs on while the replayer has not
answered, and the future completes (outputs written) when the answer lands; a replayer that never
answers fails the script's wait with the op named, not the submit. The replayer's end of the lane
is a plain gloo peer here (the protocol: the rank's input out, its output back)."""

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from prism.core.errors import PrismError
from prism.graph.records import CommOp
from prism.nccl_patches.linkmodel import probe_time
from prism.nccl_patches.vplan import Lane
from prism.sandbox.engines.base import CommRequest, GroupHandle
from prism.sandbox.engines.device_path import DeviceLanes

pytestmark = pytest.mark.timeout(60)

GROUP = GroupHandle("g", ranks=(0, 1), group_rank=0)


def _lanes_and_replayer(timeout_s: float):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    lane = Lane("g", 0)

    def client() -> dist.Store:
        return dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=30))

    lanes = DeviceLanes(rank=0, device=torch.device("cpu"), lanes=[(lane, 0)], store_factory=client,
                        timeout_s=timeout_s)
    peer: dict = {}

    def replayer_end() -> None:  # joins the lane, answers the warm-up and times the link, as the replayer does
        pg = dist.ProcessGroupGloo(dist.PrefixStore(lane.prefix + "/", client()), 1, 2,
                                   datetime.timedelta(seconds=30))
        probe = torch.zeros(1)
        pg.recv([probe], 0, 0).wait()
        pg.send([probe], 0, 0).wait()
        peer["link"] = probe_time(pg, 0, torch.device("cpu"))
        peer["pg"] = pg

    t = threading.Thread(target=replayer_end)
    t.start()
    lanes.open_group("g")
    t.join(timeout=30)
    assert peer["link"].latency_ns > 0, "the replayer timed the link through the rank's echo"
    return store, lanes, peer["pg"]


def test_a_delegated_all_reduce_completes_when_the_replayer_answers_not_at_submit():
    store, lanes, pg = _lanes_and_replayer(timeout_s=30)
    try:
        data = torch.arange(8, dtype=torch.float32)
        req = CommRequest(CommOp.ALL_REDUCE, GROUP, inputs=[data], outputs=[data], reduce_op="sum", seq=0)
        future = lanes.submit(req, lanes.lane_for(req))
        received = torch.empty(8)
        pg.recv([received], 0, 0).wait()  # the rank's input has left while its future is pending
        assert torch.equal(received, torch.arange(8, dtype=torch.float32))
        assert not future.done()
        assert torch.equal(data, torch.arange(8, dtype=torch.float32))  # nothing written yet
        pg.send([received * 3], 0, 0).wait()
        assert future.wait() is req.outputs
        assert torch.equal(data, torch.arange(8, dtype=torch.float32) * 3)
    finally:
        lanes.close()
        del store


def test_a_replayer_that_never_answers_fails_the_wait_with_the_op_named():
    store, lanes, pg = _lanes_and_replayer(timeout_s=1)
    try:
        data = torch.ones(4)
        req = CommRequest(CommOp.ALL_REDUCE, GROUP, inputs=[data], outputs=[data], reduce_op="sum", seq=7)
        future = lanes.submit(req, lanes.lane_for(req))  # posting does not block on the answer
        pg.recv([torch.empty(4)], 0, 0).wait()
        with pytest.raises(PrismError, match="rank 0: all_reduce on group g seq 7: the replayer did not answer"):
            future.wait()
    finally:
        lanes.close()
        del store
