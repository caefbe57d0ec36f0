"""An op's completion is stamped by the thread that completes it, before the script wakes: the
observer's done-callback needs the GIL, and a script that runs Python right after waking (DDP's
optimizer step after its C++ wait on the bucket all-reduces) holds it, so a time read in the
callback comes that much later and a calibration slice's async ops looked several ms longer than
the script waited for them."""

import threading
import time

import pytest
import torch

from prism.sandbox.engines.base import DONE_NS
from prism.sandbox.engines.completion import CompletionThreads

pytestmark = pytest.mark.timeout(60)

SCRIPT_PYTHON_S = 0.05


def test_the_stamp_precedes_the_woken_scripts_python_and_the_callback_may_not():
    threads = CompletionThreads("test-stamp")
    released = threading.Event()
    extra: dict = {}
    future = torch.futures.Future()
    callback_ns = []
    future.add_done_callback(lambda _f: callback_ns.append(time.perf_counter_ns()))
    threads.complete("stream", released.wait, future, ["outputs"], extra)
    time.sleep(0.01)
    released.set()
    assert future.wait() == ["outputs"]
    woke_ns = time.perf_counter_ns()
    end = time.perf_counter() + SCRIPT_PYTHON_S
    while time.perf_counter() < end:  # the script's Python after waking, holding the GIL
        pass
    threads.close()
    deadline = time.monotonic() + 5
    while not callback_ns and time.monotonic() < deadline:
        time.sleep(0.001)
    assert DONE_NS in extra
    # Stamped before the script woke (allow a few ms of this host's scheduling); the callback ran
    # whenever the completing thread got the GIL back, possibly after all of the script's Python.
    assert extra[DONE_NS] <= woke_ns + 5_000_000
    assert callback_ns and callback_ns[0] >= extra[DONE_NS]


def test_a_failed_wait_completes_the_future_with_its_error_and_no_stamp():
    threads = CompletionThreads("test-stamp-error")
    extra: dict = {}
    future = torch.futures.Future()

    def fails() -> None:
        raise RuntimeError("the lane broke")

    threads.complete("stream", fails, future, ["outputs"], extra)
    with pytest.raises(RuntimeError, match="the lane broke"):
        future.wait()
    threads.close()
    assert DONE_NS not in extra
