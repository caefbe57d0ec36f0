"""Four ranks, every collective and P2P op, several dtypes, a subgroup; an SGD step per iteration."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([0, 1]) if True else None
odd = dist.new_group([1, 3])
torch.manual_seed(rank)
w = torch.nn.Parameter(torch.randn(8))
opt = torch.optim.SGD([w], lr=0.1)

for step in range(2):
    x = torch.randn(8)
    loss = ((w * x).sum() - 1.0) ** 2
    loss.backward()
    dist.all_reduce(w.grad, op=dist.ReduceOp.SUM)
    w.grad /= world
    m = torch.tensor([rank * 3 + step], dtype=torch.int64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    b = torch.full((3,), rank + 0.5, dtype=torch.bfloat16)
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    dist.all_reduce(torch.tensor([rank + 1], dtype=torch.int32), op=dist.ReduceOp.PRODUCT)
    dist.all_reduce(torch.tensor([rank + 1], dtype=torch.uint8), op=dist.ReduceOp.BOR)
    gathered = [torch.empty(2) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    flat = torch.empty(world * 2, dtype=torch.float64)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), dtype=torch.float64))
    rs = torch.empty(3)
    dist.reduce_scatter_tensor(rs, torch.arange(world * 3, dtype=torch.float32) * (rank + 1))
    # uneven all-to-all: rank s sends s + d + 1 rows to rank d (MoE-like split sizes)
    splits_in = [rank + d + 1 for d in range(world)]
    splits_t = torch.tensor(splits_in, dtype=torch.int64)
    splits_out_t = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(splits_out_t, splits_t)
    splits_out = splits_out_t.tolist()
    out = torch.empty(sum(splits_out), 2)
    dist.all_to_all_single(out, torch.full((sum(splits_in), 2), float(rank)), splits_out, splits_in)
    t = torch.full((4,), float(rank)) if rank == 2 else torch.zeros(4)
    dist.broadcast(t, src=2)
    r = torch.full((2,), float(rank))
    dist.reduce(r, dst=1, op=dist.ReduceOp.SUM)
    g = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), g, dst=0)
    s = torch.empty(2)
    dist.scatter(s, [torch.full((2,), 10.0 * k) for k in range(world)] if rank == 3 else None, src=3)
    objs = [{"step": step, "lr": 0.1}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    if rank in (0, 1):
        v = torch.full((2,), float(rank + step))
        dist.all_reduce(v, group=pair)
    if rank in (1, 3):
        dist.all_reduce(torch.ones(1), group=odd)
    # ring of send/recv, posted as a batch like pipeline schedules do
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    inbox = torch.empty(3)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, inbox, prv), dist.P2POp(dist.isend, torch.full((3,), float(rank)), nxt)])
    for q in reqs:
        q.wait()
    assert inbox[0].item() == prv, inbox
    with torch.no_grad():
        w.add_(inbox.sum() * 1e-3 + float(b[0]) * 1e-3 + float(rs.sum()) * 1e-4 + out.sum() * 1e-4 + s.sum() * 1e-4)
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
