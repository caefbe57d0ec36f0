"""No optimizer, no prism.mark_step(), and a comm sequence that never repeats: every all_reduce has
another shape. prism cannot find the steps of this program."""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()
dist.init_process_group("gloo")
for i in range(args.steps):
    time.sleep(0.01)
    dist.all_reduce(torch.ones(i + 1))
dist.destroy_process_group()
