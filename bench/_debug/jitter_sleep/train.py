"""Sleep compute with random per-segment jitter (an exponential extra, drawn from os.urandom: no two
runs alike) and a blocking all_reduce after each segment: a job whose real step holds the ranks'
waits for whichever member was late at each collective. bench/_debug/jitter_effect.py on its real
graph shows that share; `prism validate --job bench/_debug/jitter_sleep/job.yaml --ranks 1` checks
the emulation on it (docs/STATUS.md, session 29)."""
import argparse
import os
import random
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--segments", type=int, default=12)
p.add_argument("--base-ms", type=float, default=8.0)
p.add_argument("--jitter-ms", type=float, default=1.5, help="mean of an exponential extra per segment")
p.add_argument("--numel", type=int, default=12500)
a = p.parse_args()
dist.init_process_group("gloo")
rng = random.Random(os.urandom(8))
w = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([w], lr=0.1)
buf = torch.ones(a.numel)
for _step in range(a.steps):
    for _segment in range(a.segments):
        time.sleep((a.base_ms + rng.expovariate(1.0 / a.jitter_ms)) / 1000.0)
        dist.all_reduce(buf)
        buf.fill_(1.0)
    loss = (w - 1).pow(2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
