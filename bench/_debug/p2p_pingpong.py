"""Ping-pong of a small tensor between ranks 0 and 1 over send/recv (W=2): the time per round trip
under a plain launch vs ``prism record``, i.e. the recorder's cost per P2P message (issue 11 part 5).

    python bench/_debug/p2p_pingpong.py --iters 2000      # as a plain rank (RANK/WORLD_SIZE set)

Under ``prism record`` give it a job file (W=2) and ``PINGPONG_OUT=FILE``: rank 0 appends its line
there. ``--own-group``: over a ProcessGroupGloo built as prism's passthrough engine builds one.
"""
import argparse, os, time
import torch, torch.distributed as dist

p = argparse.ArgumentParser(); p.add_argument("--iters", type=int, default=2000); p.add_argument("--numel", type=int, default=1024)
p.add_argument("--own-group", action="store_true", help="over a ProcessGroupGloo built as prism's passthrough builds one")
a = p.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank(); t = torch.zeros(a.numel)
if a.own_group:
    import datetime
    store = dist.distributed_c10d._get_default_store()
    pg = dist.ProcessGroupGloo(dist.PrefixStore("own/", store), r, 2, datetime.timedelta(seconds=60))
    dist.send = lambda t, dst: pg.send([t], dst, 0).wait()
    dist.recv = lambda t, src: pg.recv([t], src, 0).wait()
for phase in ("warm", "timed"):
    n = 200 if phase == "warm" else a.iters
    dist.barrier(); t0 = time.perf_counter(); c0 = time.process_time()
    for _ in range(n):
        if r == 0:
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
