"""The mismatch/deadlock report: every rank's pending op, like PyTorch's Flight Recorder."""

from __future__ import annotations

from prism.core.ranks import format_rank_ranges
from prism.rpc import CommHeader

__all__ = ["describe_op", "format_pending_report"]


def describe_op(h: CommHeader) -> str:
    """``all_reduce sum g0:2 f32 (4,) at train.py:14``"""
    dtype = h.inputs[0].dtype if h.inputs else (h.outputs[0].dtype if h.outputs else "")
    shapes = " ".join(str(tuple(m.shape)) for m in (h.inputs or h.outputs)) or "-"
    red = f" {h.reduce_op}" if h.reduce_op else ""
    if h.op in ("send", "recv"):
        where = f" {'to' if h.op == 'send' else 'from'} rank {h.peer} on group {h.group_id} seq {h.seq}"
    else:
        root = f" root {h.root}" if h.root >= 0 else ""
        where = f" on group {h.group_id} seq {h.seq}{root}"
    detail = f" {dtype} {shapes}" if dtype else ""
    return f"{h.op}{red}{where}{detail} at {h.call_site or '?'}"


def format_pending_report(title: str, waiting: dict, instances: dict, recvs: list, sends: list) -> str:
    """``waiting[rank] = (status, pending header or None, last header or None)``;
    ``instances[(group, seq)] = (members, arrived)``; ``recvs``/``sends``: unmatched P2P keys."""
    lines = [title] if title else []
    for (group, seq), (members, arrived) in sorted(instances.items()):
        missing = [r for r in members if r not in arrived]
        culprits = []
        for r in missing:
            status, pending, last = waiting[r]
            if pending is not None:
                culprits.append(f"rank {r} waits in {describe_op(pending)}")
            elif status == "finished":
                culprits.append(f"rank {r} finished without issuing it"
                                + (f" (its last op: {describe_op(last)})" if last else ""))
            else:
                culprits.append(f"rank {r} is {status}")
        example = next((waiting[r][1] for r in arrived if waiting[r][1] is not None
                        and (waiting[r][1].group_id, waiting[r][1].seq) == (group, seq)), None)
        what = describe_op(example) if example else f"collective on group {group} seq {seq}"
        lines.append(f"  {what}: ranks {format_rank_ranges(arrived)} arrived, "
                     f"missing {format_rank_ranges(missing)}")
        lines.extend(f"    {c}" for c in culprits)
    for src, dst, group, seq in recvs:
        lines.append(f"  recv on rank {dst} from rank {src} (group {group} seq {seq}): no matching send")
    for src, dst, group, seq in sends:
        lines.append(f"  send from rank {src} to rank {dst} (group {group} seq {seq}): never received")
    if title:
        lines.append("per rank:" if len(lines) > 1 else "")
    for rank in sorted(waiting):
        status, pending, last = waiting[rank]
        if pending is not None:
            lines.append(f"  rank {rank}: {status}, waits in {describe_op(pending)}")
        else:
            lines.append(f"  rank {rank}: {status}" + (f", last op {describe_op(last)}" if last else ""))
    return "\n".join(lines)
