"""Generated messages <-> plain dataclasses (private to prism.rpc)."""

from __future__ import annotations

from ._pb import coordinator_pb2 as pb
from .messages import CommHeader, TensorMeta

__all__ = ["meta_to_pb", "meta_from_pb", "header_to_pb", "header_from_pb"]


def meta_to_pb(m: TensorMeta) -> pb.TensorMeta:
    return pb.TensorMeta(dtype=m.dtype, shape=list(m.shape), size_bytes=m.size_bytes)


def meta_from_pb(m: pb.TensorMeta) -> TensorMeta:
    return TensorMeta(m.dtype, tuple(m.shape))


def header_to_pb(h: CommHeader) -> pb.CommHeader:
    return pb.CommHeader(
        rank=h.rank, op_index=h.op_index, op=h.op, group_id=h.group_id, group_ranks=list(h.group_ranks),
        seq=h.seq, reduce_op=h.reduce_op, root=h.root, peer=h.peer, tag=h.tag,
        in_splits=list(h.in_splits), out_splits=list(h.out_splits), flat=h.flat, coalesced=h.coalesced,
        inputs=[meta_to_pb(m) for m in h.inputs], outputs=[meta_to_pb(m) for m in h.outputs],
        call_site=h.call_site,
    )


def header_from_pb(m: pb.CommHeader) -> CommHeader:
    return CommHeader(
        rank=m.rank, op_index=m.op_index, op=m.op, group_id=m.group_id, group_ranks=tuple(m.group_ranks),
        seq=m.seq, reduce_op=m.reduce_op, root=m.root, peer=m.peer, tag=m.tag,
        in_splits=tuple(m.in_splits), out_splits=tuple(m.out_splits), flat=m.flat, coalesced=m.coalesced,
        inputs=tuple(meta_from_pb(x) for x in m.inputs), outputs=tuple(meta_from_pb(x) for x in m.outputs),
        call_site=m.call_site,
    )
