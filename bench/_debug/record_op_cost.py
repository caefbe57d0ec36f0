"""The Python cost per comm op of prism's process group and recorder, in one process, without a
backend: ``dist.isend(...).wait()`` / ``dist.all_reduce`` on the ``prism`` backend with the ``fake``
engine (completes at once) under (a) a null observer, (b) the real Recorder; µs per op, medians of 5
takes (issue 11 part 5: what ``prism record`` adds to each op before gloo does anything).

    PYTHONPATH=$PWD python bench/_debug/record_op_cost.py
"""
import statistics, time
import torch, torch.distributed as dist
from prism.sandbox import backend as pg_backend
from prism.sandbox.engines.fake import FakeEngine
from prism.sandbox.recorder import Recorder


class Null:
    def on_issue(self, req): return 0
    def on_complete(self, token, end_event=None, done_ns=None): pass
    def on_wait(self, token): return lambda: None
    def on_group(self, group): pass


def per_op_us(fn, n=3000):
    takes = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        takes.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(takes)


ctx = pg_backend.SandboxContext(FakeEngine(), Null(), world_size=2, rank=0)
pg_backend.set_context(ctx)
pg_backend.register_backend()
dist.init_process_group("prism", store=dist.HashStore(), rank=0, world_size=2)
t = torch.zeros(1024)
cases = {"isend+wait": lambda: dist.isend(t, 1).wait(), "send": lambda: dist.send(t, 1),
         "all_reduce": lambda: dist.all_reduce(t)}
for name, observer in (("null observer", Null()), ("Recorder", Recorder(0, 2))):
    ctx.observer = observer
    print(name, {k: round(per_op_us(f), 1) for k, f in cases.items()})
dist.destroy_process_group()
