"""How often ProcessGroupGloo still holds a collective's tensor after the script has dropped it.

Two processes, one ProcessGroupGloo. ``--ops`` times: a fresh 256 B tensor is all-reduced, the
script waits for the op's future, drops the tensor, and checks a weak reference to its storage's
Python object (what prism's tracker counts by): alive means gloo's worker thread, which drops
the work only after completing the future, still holds it — so a tracked peak taken at the next
allocation counts it or not depending on scheduling (#12). The same with the tensor handed to gloo
as a non-owning alias (``prism.sandbox.engines.passthrough._unowned``): never alive.

    python bench/gloo_hold.py        # JSON to bench/results/gloo_hold.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

from prism.graph.records import CommOp
from prism.sandbox.engines.base import CommRequest
from prism.sandbox.engines.passthrough import _unowned

HERE = Path(__file__).resolve().parent


def _alias(t: torch.Tensor) -> torch.Tensor:
    return _unowned(CommRequest(op=CommOp.ALL_REDUCE, group=None, inputs=[t], outputs=[t])).inputs[0]


def count_alive(pg, ops: int, *, alias: bool) -> int:
    alive = 0
    for _ in range(ops):
        x = torch.ones(64)
        st = x.untyped_storage()
        ref = weakref.ref(st)
        del st
        work = pg.allreduce([_alias(x) if alias else x])
        fut = work.get_future()
        del work
        fut.wait()
        del fut, x
        alive += ref() is not None
    return alive


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--port", type=int, default=29000 + os.getpid() % 1000)
    p.add_argument("--out", default=str(HERE / "results/gloo_hold.json"))
    ns = p.parse_args()
    pid = os.fork()
    rank = 0 if pid else 1
    store = dist.TCPStore("127.0.0.1", ns.port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    pg = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))
    owned = count_alive(pg, ns.ops, alias=False)
    aliased = count_alive(pg, ns.ops, alias=True)
    if rank == 1:
        os._exit(0)
    os.waitpid(pid, 0)
    out = {"ops": ns.ops, "alive_after_drop_owned": owned, "alive_after_drop_aliased": aliased,
           "host_cpus": os.cpu_count(), "load_average": os.getloadavg()}
    print(json.dumps(out))
    Path(ns.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
