"""Ping-pong of a small tensor between ranks 0 and 1 over send/recv (W=2), or (``--op``) a loop of
small all_reduces: the time per round trip
under a plain launch vs ``prism record``, i.e. the recorder's cost per P2P message or per
collective (issue 11 part 5).

    python bench/_debug/p2p_pingpong.py --iters 2000      # as a plain rank (RANK/WORLD_SIZE set)

Under ``prism record`` give it a job file (W=2) and ``PINGPONG_OUT=FILE``: rank 0 appends its line
there. ``--own-group``: over a ProcessGroupGloo built as prism's passthrough engine builds one.

``--python-pg MODE`` (plain launch): the floor of a Python process group over gloo, a
``dist.ProcessGroup`` subclass of a few lines registered as the default backend that forwards
send/recv to a ProcessGroupGloo. ``direct`` returns gloo's work; ``syncwrap`` waits in the caller and
returns a Python ``Work`` over a completed future; ``future`` has a thread per stream wait and
complete the future, as prism's passthrough engine does for gloo send/recv (docs/emulate.md,
"Session 21: the ping-pong on 16 cores").
"""
import argparse, datetime, os, queue, threading, time
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol

p = argparse.ArgumentParser(); p.add_argument("--iters", type=int, default=2000); p.add_argument("--numel", type=int, default=1024)
p.add_argument("--op", choices=["sendrecv", "allreduce", "allreduce-async", "funcol"], default="sendrecv",
               help="what a round trip is: a send and a receive, or one all_reduce (waited at once, "
                    "issued with async_op=True and then waited, or a functional all_reduce and its wait_tensor, "
                    "as DTensor's tensor parallelism issues them)")
p.add_argument("--own-group", action="store_true", help="over a ProcessGroupGloo built as prism's passthrough builds one")
p.add_argument("--python-pg", choices=["direct", "syncwrap", "future"], default=None,
               help="through a minimal Python process group over gloo (plain launch only)")
a = p.parse_args()


class FutureWork(dist.Work):
    def __init__(self, f): super().__init__(); self.f = f
    def wait(self, timeout=None): self.f.wait(); return True
    def get_future(self): return self.f


class PythonGroup(dist.ProcessGroup):
    def __init__(self, store, rank, size, mode):
        super().__init__(rank, size)
        self.g = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, datetime.timedelta(seconds=60))
        self.mode, self.queues = mode, {}
    def getBackendName(self): return "pingpong"
    def _stream(self, key):
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = queue.SimpleQueue()
            def loop():
                while True:
                    w, f = q.get(); w.wait(); f.set_result(None)
            threading.Thread(target=loop, daemon=True).start()
        return q
    def _wrap(self, w, key):
        if self.mode == "direct": return w
        f = torch.futures.Future()
        if self.mode == "syncwrap": w.wait(); f.set_result(None)
        else: self._stream(key).put((w, f))
        return FutureWork(f)
    def send(self, t, dst, tag=0): return self._wrap(self.g.send(t, dst, tag), ("s", dst))
    def recv(self, t, src, tag=0): return self._wrap(self.g.recv(t, src, tag), ("r", src))
    def barrier(self, opts=None): return self.g.barrier(dist.BarrierOptions())


if a.python_pg:
    dist.Backend.register_backend("pingpong", lambda common, _opts: PythonGroup(
        common.store, common.group_rank, common.group_size, a.python_pg), extended_api=True, devices=["cpu"])
dist.init_process_group("pingpong" if a.python_pg else "gloo")
r = dist.get_rank(); t = torch.zeros(a.numel)
if a.own_group:
    store = dist.distributed_c10d._get_default_store()
    pg = dist.ProcessGroupGloo(dist.PrefixStore("own/", store), r, 2, datetime.timedelta(seconds=60))
    dist.send = lambda t, dst: pg.send([t], dst, 0).wait()
    dist.recv = lambda t, src: pg.recv([t], src, 0).wait()
    dist.all_reduce = lambda t, async_op=False: pg.allreduce([t]) if async_op else pg.allreduce([t]).wait()
for phase in ("warm", "timed"):
    n = 200 if phase == "warm" else a.iters
    dist.barrier(); t0 = time.perf_counter(); c0 = time.process_time()
    for _ in range(n):
        if a.op == "allreduce":
            dist.all_reduce(t)
        elif a.op == "allreduce-async":
            dist.all_reduce(t, async_op=True).wait()
        elif a.op == "funcol" and a.own_group:  # the group is no c10d group: the same gloo op, waited
            dist.all_reduce(t)
        elif a.op == "funcol":
            t = funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
        elif r == 0:
            dist.send(t, 1); dist.recv(t, 1)
        else:
            dist.recv(t, 0); dist.send(t, 0)
    dt = time.perf_counter() - t0; dc = time.process_time() - c0
if r == 0:
    out = os.environ.get("PINGPONG_OUT")
    line = f"{dt / a.iters * 1e6:.1f} us per round trip, cpu {dc / a.iters * 1e6:.1f} us"
    if out: open(out, "a").write(line + "\n")
    print(line)
dist.destroy_process_group()
