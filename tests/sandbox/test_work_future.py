"""An engine completes an op's Python future from its own thread; DDP's reducer (C++) reads that
future, never the Work's ``wait``. A failed op reaches the script as an exception from
``backward`` (it used to segfault the rank: the reducer read the exception object as the op's
tensors), and a completed one hands the reducer its tensors through the same path."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import sys, threading
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from prism.sandbox.backend import PrismWork

MODE = sys.argv[1]


def done(value):
    future = torch.futures.Future()
    future.set_result(value)
    return PrismWork(future, lambda: (lambda: None))


class OneRankGroup(dist.ProcessGroup):
    # What DDP asks of a group at construction (a parameter check, the module states) and in the
    # backward (one all-reduce per bucket, completed later from another thread, as prism's engines do).
    def __init__(self):
        super().__init__(0, 1)

    def getBackendName(self):
        return "one-rank"

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            outs[0].copy_(t)
        return done(output_tensors)

    def broadcast(self, tensors, opts=None):
        return done(tensors)

    def allreduce(self, tensors, opts=None):
        future = torch.futures.Future()
        if MODE == "fail":
            complete = lambda: future.set_exception(ValueError("the link to rank 3 was lost"))
        else:
            complete = lambda: future.set_result([t.mul_(3) for t in tensors])
        threading.Timer(0.05, complete).start()
        return PrismWork(future, lambda: (lambda: None))


torch.manual_seed(0)
module = torch.nn.Linear(4, 4)
model = DDP(module, process_group=OneRankGroup())
model(torch.ones(2, 4)).sum().backward()
print("bias grad", module.bias.grad.tolist())
"""


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=100)


def test_a_failed_op_under_ddp_raises_from_backward_with_its_message_and_does_not_crash_the_rank():
    result = run("fail")
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])  # -11 before: SIGSEGV
    assert "ValueError: the link to rank 3 was lost" in result.stderr
    assert "bias grad" not in result.stdout


def test_a_completed_op_under_ddp_hands_the_reducer_its_tensors():
    result = run("ok")
    assert result.returncode == 0, result.stderr[-2000:]
    # d(sum)/d(bias) is 2 per element (two rows); the "all-reduce" tripled it, DDP divided by 1 rank
    assert "bias grad [6.0, 6.0, 6.0, 6.0]" in result.stdout
