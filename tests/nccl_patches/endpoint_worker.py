"""One endpoint process of a multi-process pruned-collective test (a sandbox rank or a vrank host).

Loads a plan written by the test, joins the gloo transport, runs every collective of the plan in
order with its own tag range, and saves outputs and per-link traffic.
"""

from __future__ import annotations

import traceback


def main(plan_path: str, endpoint: int, port: int, out_path: str) -> None:
    try:
        _run(plan_path, endpoint, port, out_path)
    except BaseException:
        with open(out_path + ".error", "w") as f:
            f.write(traceback.format_exc())
        raise


def _run(plan_path: str, endpoint: int, port: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from prism.nccl_patches.pruned import neighbor_ranks, run_neighbor_side, run_sandbox_side
    from prism.nccl_patches.transport import Transport

    plan = torch.load(plan_path, weights_only=False)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    transport = Transport.connect(store, endpoint, plan["num_endpoints"], plan["endpoint_of"], timeout_s=90)
    n = plan["n"]
    results = []
    for i, job in enumerate(plan["jobs"]):
        rec = job["recorded"]
        tag_base = i * 2 * n * n
        if endpoint < len(plan["sandbox"]):
            rank = plan["sandbox"][endpoint]
            res = run_sandbox_side(transport, rec.algo, rank, job["data"][rank], group_size=n, tag_base=tag_base,
                                   recorded=rec, **job["kwargs"].get(rank, {}))
            results.append({"output": res.output, "diverged": res.diverged, "traffic": res.traffic})
        else:
            hosted = {v for v in neighbor_ranks(rec) if plan["endpoint_of"][v] == endpoint}
            res = run_neighbor_side(transport, rec, hosted, tag_base=tag_base)
            results.append({"traffic": res.traffic})
    torch.save(results, out_path)
    transport.close()
