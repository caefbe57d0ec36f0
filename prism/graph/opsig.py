"""A comm op's fingerprint (what every member must agree on) and its one-line description, from
its fields as the recorder keeps them (a dict) or as the graph stores them (``node_fields``).
Shared by the ranks' op publication (``prism.sandbox.opwatch``) and the emulation launcher, which
compares a sandbox rank's op with the recorded one (``docs/hangs.md``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from .records import CommOp, Graph, Node

__all__ = ["fingerprint", "describe", "op_key", "node_fields", "recorded_ops"]

_REDUCING = (CommOp.ALL_REDUCE, CommOp.REDUCE)
_ROOTED = (CommOp.BROADCAST, CommOp.REDUCE, CommOp.GATHER, CommOp.SCATTER)


def _shapes(shapes) -> str:
    return " ".join(str(tuple(s)) for s in shapes) or "-"


def fingerprint(node: Mapping) -> str:
    """What every member of the op must agree on (PyTorch's DETAIL check compares the same: op,
    dtype, shapes). All-gather compares the gathered shapes (inputs may be uneven), reduce-scatter
    its inputs, a message its element count; all-to-all's splits and gather/scatter's non-root
    sides legitimately differ."""
    op: CommOp = node["op"]
    dtype = node.get("dtype", "")
    if op is CommOp.BARRIER:
        return op.value
    if op in (CommOp.SEND, CommOp.RECV):
        # A message is bytes: a (2, 2) send into a (4,) recv is fine with gloo and NCCL.
        return f"{dtype} {' '.join(str(math.prod(s)) for s in node['shapes'])} elements"
    parts = [op.value, node.get("reduce_op", "") if op in (*_REDUCING, CommOp.REDUCE_SCATTER) else ""]
    if op in _ROOTED:
        parts.append(f"root {node.get('peer', -1)}")
    parts.append(dtype)
    if op in (CommOp.ALL_REDUCE, CommOp.BROADCAST, CommOp.REDUCE, CommOp.REDUCE_SCATTER):
        parts.append(_shapes(node["shapes"]))
    elif op is CommOp.ALL_GATHER:
        parts.append(_shapes(node.get("out_shapes", node["shapes"])))
    return " ".join(p for p in parts if p)


def describe(node: Mapping) -> tuple[str, str]:
    """The op's description around its seq: ``("all_reduce sum on group 0 seq ", " f32 (5,) at train.py:9")``
    (the words of ``prism collect``'s reports)."""
    op: CommOp = node["op"]
    red = f" {node['reduce_op']}" if node.get("reduce_op") else ""
    gid, peer = node["group_id"], node.get("peer", -1)
    if op is CommOp.SEND:
        where = f" to rank {peer} on group {gid} seq "
    elif op is CommOp.RECV:
        where = f" from rank {peer} on group {gid} seq "
    else:
        where = f" on group {gid} seq "
    root = f" root {peer}" if op in _ROOTED and peer >= 0 else ""
    dtype = node.get("dtype", "")
    detail = f" {dtype} {_shapes(node['shapes'])}" if dtype else ""
    out = node.get("out_shapes")
    if out is not None and op is not CommOp.ALL_TO_ALL:
        detail += f" -> {_shapes(out)}"
    return f"{op.value}{red}{where}", f"{root}{detail} at {node.get('call_site') or '?'}"


def node_fields(node: Node) -> dict:
    """A graph node's fields in the recorder's form (``out_shapes`` only where it differs)."""
    fields = {"op": node.op, "group_id": node.group_id, "seq": node.seq, "peer": node.peer,
              "reduce_op": node.reduce_op, "dtype": node.dtype, "shapes": node.shapes, "call_site": node.call_site}
    if node.out_shapes:
        fields["out_shapes"] = node.out_shapes
    return fields


def op_key(node: Mapping, rank: int) -> tuple[str, str]:
    """(the op's key without its seq, its members): ``("0:", "g:0")`` for a collective of group 0,
    ``("0:1>2:", "p:1,2")`` for a message from rank 1 to rank 2 (either end)."""
    op, gid = node["op"], node["group_id"]
    if op in (CommOp.SEND, CommOp.RECV):
        src, dst = (rank, node["peer"]) if op is CommOp.SEND else (node["peer"], rank)
        return f"{gid}:{src}>{dst}:", f"p:{src},{dst}"
    return f"{gid}:", f"g:{gid}"


def recorded_ops(graph: Graph, ranks) -> dict[tuple[int, str], tuple[str, str]]:
    """``(rank, key) -> (fingerprint, description)`` of every comm op of ``ranks`` in ``graph``."""
    ops = {}
    for rank in ranks:
        for node in graph.nodes.get(rank, ()):
            if node.is_comm:
                fields = node_fields(node)
                before, after = describe(fields)
                ops[(rank, f"{op_key(fields, rank)[0]}{node.seq}")] = (fingerprint(fields), f"{before}{node.seq}{after}")
    return ops
