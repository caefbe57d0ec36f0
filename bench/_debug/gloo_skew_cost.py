"""Does a late rank make gloo's allreduce cost more CPU? Two ranks, 8 matmuls then an allreduce per
iteration, rank 1 sleeping ``skew_ms`` first (session 11: 2 ms of skew, 600 iterations, 0.5 and 4 MB:
rank 0's CPU per iteration unchanged, 4.0–6.9 vs 5.2–6.9 ms; the late rank's +0.2–0.5 ms at 4 MB).
Run as two ranks: ``python gloo_skew_cost.py SKEW_MS ITERATIONS NUMEL``."""
import os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
skew_ms = float(sys.argv[1]); n = int(sys.argv[2]); numel = int(sys.argv[3])
dist.init_process_group("gloo")
t = torch.ones(numel)
x = torch.randn(256, 256)
dist.barrier()
c0 = time.process_time(); w0 = time.perf_counter()
for i in range(n):
    for _ in range(8):
        x @ x
    if rank == 1 and skew_ms:
        time.sleep(skew_ms / 1e3)
    dist.all_reduce(t)
c1 = time.process_time(); w1 = time.perf_counter()
print(f"rank {rank} skew {skew_ms} numel {numel}: cpu {(c1-c0)/n*1e3:.3f} ms/iter (minus sleep n/a), wall {(w1-w0)/n*1e3:.3f}", flush=True)
dist.destroy_process_group()
