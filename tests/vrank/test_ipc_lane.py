"""The CUDA IPC lane between two real processes on one GPU (prism.nccl_patches.ipc_lane): messages
of every size class (empty, smaller than a slot, several slots through a ring of two) arrive bit for
bit in both directions; mapping the replayer's buffer does not show in the sandbox process's
allocator statistics; a receive posted before the peer sends returns at once (the GPU waits, not
the CPU), and the data lands when the peer sends."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import sys
import time

import pytest
import torch

pytestmark = [pytest.mark.timeout(300), pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SLOT = 1 << 20
SIZES = [0, 1, 4096, 3 * SLOT + 12345, 257]  # bytes; the 4th takes four chunks through a ring of two
LATE_S = 1.0


def _pattern(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=g)


def _end(end: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from prism.nccl_patches.ipc_lane import IpcLane, same_gpu

    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", port, 2, end == 1, timeout=datetime.timedelta(seconds=60))
    result: dict = {}
    before = torch.cuda.memory_allocated()
    assert same_gpu(store, end, torch.device("cuda", 0))
    lane = IpcLane(store, end, torch.device("cuda", 0), slot_bytes=SLOT, num_slots=2)
    result["mapped_bytes"] = torch.cuda.memory_allocated() - before
    if end == 0:  # the sandbox: sends every size, then receives the late message
        for i, n in enumerate(SIZES):
            lane.send([_pattern(n, i)]).wait()
        late = torch.empty(2 * SLOT + 7, dtype=torch.uint8, device="cuda")
        t0 = time.perf_counter()
        work = lane.recv([late])
        result["recv_enqueue_s"] = time.perf_counter() - t0
        work.wait()
        torch.cuda.synchronize()
        result["recv_done_s"] = time.perf_counter() - t0
        result["late_equal"] = bool(torch.equal(late, _pattern(late.numel(), 99)))
    else:  # the replayer: receives every size, then sends late
        equal = []
        for i, n in enumerate(SIZES):
            buf = torch.empty(n, dtype=torch.uint8, device="cuda")
            lane.recv([buf]).wait()
            torch.cuda.synchronize()
            equal.append(bool(torch.equal(buf, _pattern(n, i))))
        result["equal"] = equal
        time.sleep(LATE_S)
        lane.send([_pattern(2 * SLOT + 7, 99)]).wait()
        torch.cuda.synchronize()
    lane.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


def test_two_processes_on_one_gpu_exchange_bit_for_bit_without_blocking_the_cpu(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    outs = [str(tmp_path / f"end{e}.json") for e in (0, 1)]
    procs = [ctx.Process(target=_end, args=(e, port, outs[e])) for e in (1, 0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    sandbox, replayer = (json.load(open(o)) for o in outs)
    assert replayer["equal"] == [True] * len(SIZES)
    assert sandbox["late_equal"]
    assert sandbox["mapped_bytes"] == 0, "the mapped buffer must not count in the sandbox's allocator"
    assert sandbox["recv_enqueue_s"] < 0.2 * LATE_S, sandbox
    assert sandbox["recv_done_s"] > 0.5 * LATE_S, sandbox


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
