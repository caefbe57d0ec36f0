"""Two ranks; each step rank 0 posts a message to rank 1 and waits for it only after 30 ms of
compute, and rank 1 posts its receive at 20 ms and waits after 60 more, as a pipeline posts its
receives early and waits after its compute: the message is done long before either wait. Then
rank 0 computes 60 ms and sends rank 1 a blocking message. ``LATE_WAIT_OFFSET`` (default 0) is
added to every value rank 0 sends (a what-if whose messages differ from the recorded ones);
``LATE_WAIT_STEPS`` (default 4) and ``LATE_WAIT_NUMEL`` (default 256) set the steps and the early
message's size."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
offset = float(os.environ.get("LATE_WAIT_OFFSET", "0"))
steps = int(os.environ.get("LATE_WAIT_STEPS", "4"))
numel = int(os.environ.get("LATE_WAIT_NUMEL", "256"))
w = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(steps):
    message = torch.full((numel,), float(step) + (offset if rank == 0 else 0.0))
    if rank == 0:
        work = dist.isend(message, 1)
        time.sleep(0.03)
        work.wait()
        time.sleep(0.06)
        dist.send(torch.ones(1) + offset, 1)
    else:
        time.sleep(0.02)
        work = dist.irecv(message, 0)
        time.sleep(0.06)
        work.wait()
        dist.recv(torch.zeros(1), 0)
    (w * w).sum().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
