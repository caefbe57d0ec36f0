"""Syscalls and bytes read/written (/proc/<pid>/io) of a run's rank processes, summed at exit:
whether ``prism record`` moves more or more messages through gloo's sockets than a plain launch.

    PYTHONPATH=$PWD:$PWD/bench python bench/_debug/io_count.py prism record --job JOB --out RUN
"""
import os, sys, time, subprocess, collections
cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
last = {}
while p.poll() is None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cl = open(f"/proc/{pid}/cmdline","rb").read().replace(b"\0",b" ").decode()
        except Exception: continue
        if ("prism.sandbox.worker" not in cl and "train.py" not in cl) or "sh -c" in cl or "launch_plain" in cl: continue
        try:
            io = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().split("\n") if l)
            last[pid] = {k: int(v) for k, v in io.items()}
        except Exception: pass
    time.sleep(0.1)
tot = collections.Counter()
for v in last.values(): tot.update(v)
print(len(last), "processes", {k: tot[k] for k in ("rchar", "wchar", "syscr", "syscw")})
