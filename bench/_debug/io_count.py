"""Syscalls and bytes read/written (/proc/<pid>/io) of a run's rank processes, summed at exit:
whether ``prism record`` moves more or more messages through gloo's sockets than a plain launch.

    PYTHONPATH=$PWD:$PWD/bench python bench/_debug/io_count.py prism record --job JOB --out RUN
"""
import os, sys, time, subprocess, collections

sys.path.insert(0, os.path.dirname(__file__))
from rank_procs import rank_pids

cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
last = {}
while p.poll() is None:
    for pid in rank_pids():
        try:
            io = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().split("\n") if l)
            last[pid] = {k: int(v) for k, v in io.items()}
        except Exception: pass
    time.sleep(0.1)
tot = collections.Counter()
for v in last.values(): tot.update(v)
print(len(last), "processes", {k: tot[k] for k in ("rchar", "wchar", "syscr", "syscw")})
