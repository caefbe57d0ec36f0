"""Per-thread CPU of a run's rank processes (prism sandbox workers or plain ``train.py`` ranks), by
thread name, sampled from /proc every 0.2 s until the command exits (session 11's look at where
``prism record``'s extra CPU goes: gloo's threads, not prism's Python):

    PYTHONPATH=$PWD:$PWD/bench python bench/_debug/thread_cpu.py prism record --job JOB --out RUN
"""
import os, sys, time, subprocess, json, collections

sys.path.insert(0, os.path.dirname(__file__))
from rank_procs import rank_pids

# sample per-thread CPU of the rank processes of a command until it exits
cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
last = {}
tick = os.sysconf("SC_CLK_TCK")
while p.poll() is None:
    for pid in rank_pids():
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                st = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")",1)[1].split()
                last[(pid, tid)] = (comm, (int(st[11])+int(st[12]))/tick)
        except Exception: pass
    time.sleep(0.2)
by = collections.defaultdict(float); npids=set()
for (pid,tid),(comm,cpu) in last.items():
    npids.add(pid)
    key = comm if not comm.startswith("python") else ("main" if pid==tid else "py-thread")
    by[key]+=cpu
print(len(npids), "processes")
for k,v in sorted(by.items(), key=lambda kv:-kv[1]): print(f"{k:24s} {v:7.2f} s")
