"""Does a Python ``.then`` callback on a gloo allreduce's future cost CPU? (session 11: no; 2 ranks,
2,000 iterations: 4.1–4.2 ms/iter either way). Run as two ranks with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set: ``python future_callback_cost.py plain|then 2000``."""
import os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
mode = sys.argv[1]; n = int(sys.argv[2])
dist.init_process_group("gloo")
pg = dist.distributed_c10d._get_default_group()
t = torch.ones(1 << 16)
def cb(f):
    f.value()
    return [t]
x = torch.randn(256, 256)
c0 = time.process_time(); w0 = time.perf_counter()
for i in range(n):
    work = pg.allreduce([t])
    fut = work.get_future()
    if mode == "then":
        fut = fut.then(cb)
    for _ in range(8):  # some compute while the op runs
        x @ x
    fut.wait()
c1 = time.process_time(); w1 = time.perf_counter()
if rank == 0:
    print(f"{mode}: cpu {(c1-c0)/n*1e3:.3f} ms/iter, wall {(w1-w0)/n*1e3:.3f} ms/iter", flush=True)
dist.destroy_process_group()
