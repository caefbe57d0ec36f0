"""Chakra execution traces (mlcommons/chakra, ``protos/et_def.proto``) of a graph, for ASTRA-sim.

One file per rank, ``<prefix>.<rank>.et``: a ``GlobalMetadata`` message, then one ``Node`` per
compute segment and comm op, each preceded by its length as a varint (Chakra's
``encodeMessage``/``decodeMessage``). Node ids are the prism node indices. Dependencies say what
the rank's program waits for: every node depends on the last node that blocked the program (a
compute, a synchronous comm); an asynchronous comm blocks nothing until its WAIT, after which the
next node depends on it too; at a step end, every outstanding comm. WAIT and MARK nodes are not
written: their meaning is in those edges (and in the ``step`` attribute).

Comm attributes follow Chakra's PyTorch converter: ``comm_type`` (``CollectiveCommType``),
``comm_size`` (bytes), ``pg_name`` (the group id), ``comm_src``/``comm_dst``/``comm_tag`` for
messages, ``is_cpu_op`` false. prism's own identities ride along as ``prism_seq``,
``prism_step``, ``prism_async``, ``prism_reduce_op``, ``prism_dtype``, ``prism_duration_ns``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from prism.core.atomic import atomic_write_bytes
from prism.core.errors import RunDirError

from ._pb import et_def_pb2 as et
from .records import CommOp, Graph, Node, NodeKind

__all__ = ["CHAKRA_VERSION", "chakra_nodes", "write_chakra", "read_chakra", "chakra_path"]

CHAKRA_VERSION = "0.0.4"
"""The schema version Chakra's converters write in ``GlobalMetadata.version``."""

_COMM_TYPE = {
    CommOp.ALL_REDUCE: et.ALL_REDUCE, CommOp.REDUCE: et.REDUCE, CommOp.ALL_GATHER: et.ALL_GATHER,
    CommOp.GATHER: et.GATHER, CommOp.SCATTER: et.SCATTER, CommOp.BROADCAST: et.BROADCAST,
    CommOp.ALL_TO_ALL: et.ALL_TO_ALL, CommOp.REDUCE_SCATTER: et.REDUCE_SCATTER, CommOp.BARRIER: et.BARRIER,
}
_NODE_TYPE = {NodeKind.COMPUTE: et.COMP_NODE, NodeKind.COLLECTIVE: et.COMM_COLL_NODE,
              NodeKind.SEND: et.COMM_SEND_NODE, NodeKind.RECV: et.COMM_RECV_NODE}


def chakra_path(out_dir: str | Path, prefix: str, rank: int) -> Path:
    return Path(out_dir) / f"{prefix}.{rank}.et"


def _attr(name: str, value) -> et.AttributeProto:
    a = et.AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, int):
        a.int64_val = value
    else:
        a.string_val = value
    return a


def _us(ns: int) -> int:
    return max(0, (ns + 500) // 1000)


def _node(n: Node, deps: list[int]) -> et.Node:
    out = et.Node(id=n.index, type=_NODE_TYPE[n.kind], data_deps=deps,
                  name=n.op.value if n.op else n.kind.value.lower())
    if n.start_ns >= 0:
        out.start_time_micros = _us(n.start_ns)
    if n.duration_ns >= 0:
        out.duration_micros = _us(n.duration_ns)
    attrs = [_attr("is_cpu_op", False), _attr("prism_step", n.step), _attr("prism_duration_ns", n.duration_ns)]
    if n.is_comm:
        attrs += [_attr("comm_size", n.size_bytes), _attr("pg_name", n.group_id), _attr("prism_seq", n.seq),
                  _attr("prism_async", n.is_async), _attr("prism_dtype", n.dtype)]
        if n.kind is NodeKind.COLLECTIVE:
            attrs.append(_attr("comm_type", _COMM_TYPE[n.op]))
            if n.reduce_op:
                attrs.append(_attr("prism_reduce_op", n.reduce_op))
            if n.peer >= 0:
                attrs.append(_attr("prism_root", n.peer))
        else:
            src, dst = (n.rank, n.peer) if n.kind is NodeKind.SEND else (n.peer, n.rank)
            attrs += [_attr("comm_src", src), _attr("comm_dst", dst), _attr("comm_tag", n.tag)]
    out.attr.extend(attrs)
    return out


def chakra_nodes(nodes: tuple[Node, ...]) -> Iterator[et.Node]:
    """One rank's Chakra nodes with the dependencies of its program (module docstring)."""
    last: int | None = None
    outstanding: dict[int, None] = {}
    extra: list[int] = []
    for n in nodes:
        if n.kind is NodeKind.WAIT:
            if n.target in outstanding:
                del outstanding[n.target]
                extra.append(n.target)
            continue
        if n.kind is NodeKind.MARK:
            if n.mark == "step_end":
                extra += list(outstanding)
                outstanding.clear()
            continue
        deps = list(dict.fromkeys(([last] if last is not None else []) + extra))
        extra = []
        yield _node(n, deps)
        if n.is_comm and n.is_async:
            outstanding[n.index] = None
        else:
            last = n.index


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _delimited(message) -> bytes:
    body = message.SerializeToString()
    return _varint(len(body)) + body


def write_chakra(graph: Graph, out_dir: str | Path, prefix: str = "prism") -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for every rank of ``graph``; returns the paths."""
    paths = []
    for rank, nodes in sorted(graph.nodes.items()):
        meta = et.GlobalMetadata(version=CHAKRA_VERSION, attr=[
            _attr("schema", "prism"), _attr("rank", rank), _attr("world_size", graph.world_size),
            _attr("job", graph.job_name), _attr("graph", graph.kind)])
        data = _delimited(meta) + b"".join(_delimited(m) for m in chakra_nodes(nodes))
        path = chakra_path(out_dir, prefix, rank)
        atomic_write_bytes(path, data)
        paths.append(path)
    return paths


def _read_varint(data: bytes, pos: int, path: Path) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise RunDirError(f"{path}: truncated Chakra trace (a length prefix at byte {pos})")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def read_chakra(path: str | Path) -> tuple[et.GlobalMetadata, list[et.Node]]:
    """Read one rank's file: its metadata and nodes."""
    path = Path(path)
    data = path.read_bytes()
    pos = 0
    messages = []
    while pos < len(data):
        size, pos = _read_varint(data, pos, path)
        if pos + size > len(data):
            raise RunDirError(f"{path}: truncated Chakra trace (message at byte {pos} needs {size} bytes)")
        msg = et.GlobalMetadata() if not messages else et.Node()
        try:
            msg.ParseFromString(data[pos:pos + size])
        except DecodeError as e:
            raise RunDirError(f"{path}: corrupt Chakra message at byte {pos}: {e}") from e
        messages.append(msg)
        pos += size
    if not messages:
        raise RunDirError(f"{path}: empty Chakra trace (no GlobalMetadata)")
    return messages[0], messages[1:]
