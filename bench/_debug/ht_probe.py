"""Which vCPUs of this VM share a physical core? A single-threaded matmul probe pinned to vCPU a
is timed alone and with a matmul busy loop pinned to vCPU b, for every b (and a few a)."""
import json, os, statistics, sys, time, multiprocessing as mp
import torch

def busy(cpu, stop):
    os.sched_setaffinity(0, {cpu}); torch.set_num_threads(1)
    x = torch.randn(256, 256)
    while not stop.is_set():
        torch.mm(x, x)

def probe(n=7):
    torch.set_num_threads(1)
    x = torch.randn(256, 256)
    takes = []
    for _ in range(n):
        t = time.perf_counter()
        for _ in range(40): torch.mm(x, x)
        takes.append((time.perf_counter() - t) * 1e3)
    return statistics.median(takes)

if __name__ == "__main__":
    cpus = sorted(os.sched_getaffinity(0))
    out = {}
    for a in [int(v) for v in sys.argv[1].split(",")]:
        os.sched_setaffinity(0, {a})
        row = {"alone": [probe() for _ in range(3)]}
        for b in cpus:
            if b == a: continue
            stop = mp.Event(); p = mp.Process(target=busy, args=(b, stop)); p.start(); time.sleep(0.2)
            row[b] = probe(); stop.set(); p.join()
        out[a] = row
        base = statistics.median(row["alone"])
        print(a, "alone", [round(v, 2) for v in row["alone"]], "slowdown by busy b:",
              {b: round(v / base, 2) for b, v in row.items() if b != "alone"}, flush=True)
    json.dump(out, open(os.environ.get("OUT", "/tmp") + "/ht.json", "w"))
