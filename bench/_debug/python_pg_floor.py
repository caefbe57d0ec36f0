"""The floor of a Python process group over gloo: a 4 KiB send/recv ping-pong (W=2) through a
``dist.ProcessGroup`` subclass of a few lines that forwards to a ProcessGroupGloo, against plain
gloo. What prism's path per message costs beyond the mechanism itself (docs/emulate.md, "Session 21:
the ping-pong on 16 cores").

    MODE=plain|direct|syncwrap|future torchrun --nproc-per-node 2 bench/_debug/python_pg_floor.py

plain: gloo itself; direct: the Python group returns gloo's work; syncwrap: it waits in the caller
and returns a Python ``Work`` over a completed future; future: a thread per stream waits and
completes the future (as prism's passthrough engine does for gloo send/recv). ITERS=3000 by default.
"""
import datetime, os, queue, threading, time
import torch, torch.distributed as dist
MODE = os.environ.get("MODE", "plain")
class W(dist.Work):
    def __init__(self, f): super().__init__(); self.f = f
    def wait(self, timeout=None): self.f.wait(); return True
    def get_future(self): return self.f
class PG(dist.ProcessGroup):
    def __init__(self, store, rank, size):
        super().__init__(rank, size)
        self.g = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, datetime.timedelta(seconds=60))
        self.q = {}
    def getBackendName(self): return "mini"
    def _thr(self, key):
        q = self.q.get(key)
        if q is None:
            q = self.q[key] = queue.SimpleQueue()
            def loop():
                while True:
                    w, f = q.get(); w.wait(); f.set_result(None)
            threading.Thread(target=loop, daemon=True).start()
        return q
    def _wrap(self, w, key):
        if MODE == "direct": return w
        if MODE == "syncwrap":
            w.wait(); f = torch.futures.Future(); f.set_result(None); return W(f)
        f = torch.futures.Future(); self._thr(key).put((w, f)); return W(f)
    def send(self, t, dst, tag=0): return self._wrap(self.g.send(t, dst, tag), ("s", dst))
    def recv(self, t, src, tag=0): return self._wrap(self.g.recv(t, src, tag), ("r", src))
    def barrier(self, opts=None): return self.g.barrier(dist.BarrierOptions())
def create(common, opts):
    return PG(common.store, common.group_rank, common.group_size)
dist.Backend.register_backend("mini", create, extended_api=True, devices=["cpu"])
dist.init_process_group("gloo" if MODE == "plain" else "mini")
r = dist.get_rank(); t = torch.zeros(1024)
for phase in ("warm", "timed"):
    n = 200 if phase == "warm" else int(os.environ.get("ITERS", "3000"))
    dist.barrier(); t0 = time.perf_counter(); c0 = time.process_time()
    for _ in range(n):
        if r == 0: dist.send(t, 1); dist.recv(t, 1)
        else: dist.recv(t, 0); dist.send(t, 0)
    dt = time.perf_counter() - t0; dc = time.process_time() - c0
if r == 0: print(f"{MODE}: {dt/n*1e6:.1f} us per round trip, cpu {dc/n*1e6:.1f}")
dist.destroy_process_group()
