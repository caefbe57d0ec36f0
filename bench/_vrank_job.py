"""The benchmark's job: the hybrid example's 3-D mesh (pp, dp, tp) at any W and its first
collectives (a TP all-reduce, then a DP all-reduce), on zeros so recorded data can be synthesized."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

p = argparse.ArgumentParser()
p.add_argument("--pp", type=int, default=2)
p.add_argument("--tp", type=int, default=2)
p.add_argument("--dp", type=int, required=True)
p.add_argument("--numel", type=int, default=8)
args = p.parse_args()
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (args.pp, args.dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
x = torch.zeros(args.numel)
dist.all_reduce(x, group=mesh["tp"].get_group())
dist.all_reduce(x, group=mesh["dp"].get_group())
dist.destroy_process_group()
