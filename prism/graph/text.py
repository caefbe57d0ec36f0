"""The text form of PrismTrace records: one line per node, parsed back exactly.

A node line is a head and space-separated tokens in a fixed order; a field at its default is
left out, so every field that is set survives ``parse_node(format_node(n)) == n``::

    r3#41 COLL all_reduce g7:12 4MiB f32[1024,1024] sum async @train.py:52 step=2 t=1200+350
    r0#5 SEND g0:3 ->1 tag=2 64KiB bf16[8,1024] t=900+40
    r1#2 RECV g0:3 <-0 64KiB bf16[8,1024]
    r2#9 COLL all_to_all g4:0 1KiB f32[16,16] out[20,16] in_splits=4,4,4,4 out_splits=5,5,5,5
    r0#7 WAIT #4
    r0#8 MARK step_end step=0 t=5000+0
    r0#0 COMP d=1000

Grammar (``N`` an integer, ``S`` a string with ``%``, ``=``, space, tab and newline percent-escaped)::

    line     := head KIND token*
    head     := "r" N "#" N                      rank, index (parse_graph also takes "r" N alone)
    KIND     := COMP | COLL | SEND | RECV | WAIT | MARK
    token    := OP                               a CommOp value (all_reduce, gather, ...)
              | "op=none"                        SEND/RECV without an op (else op send/recv implied)
              | "g" S ":" [N]                    group_id and seq (the colon is always there)
              | "->" N | "<-" N | "root=" N      peer (SEND: dst, RECV: src, others: root)
              | "tag=" N
              | N ("B" | "KiB" | "MiB" | "GiB")  size_bytes (formatted in the largest exact unit)
              | DTYPE shape*                     dtype and input shapes; shape := "[" N ("," N)* "]" | "[]"
              | "?" shape+                       input shapes without a dtype
              | "out" shape+                     out_shapes
              | "in_splits=" N ("," N)* | "out_splits=" N ("," N)*
              | REDUCE | "reduce=" S             sum avg product min max band bor bxor premul_sum
              | "async"
              | "@" S                            call_site
              | "#" N                            WAIT target
              | "step_begin" | "step_end" | "mark=" S
              | "step=" N
              | "t=" N ["+" N] | "t=?+" N | "d=" N  start_ns, duration_ns (parse takes ns/us/ms/s units)
              | "payload=" S

A graph is a block of lines: ``graph`` (world size, kind, job), ``meta``, ``group`` lines, node
lines, ``summary`` lines; ``#`` starts a comment line::

    graph world_size=2 kind=real job_name=demo
    group 0 ranks=0,1 desc=default_pg
    r0#0 COMP d=100
    r0#1 COLL all_reduce g0:0 16B f32[4] sum d=20
    r1#0 COMP d=300
    r1#1 COLL all_reduce g0:0 16B f32[4] sum d=20
    summary r0 step_times_ns=320 losses=2.5 peak_memory_bytes=4096 memory_source=tracked
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prism.core.errors import GraphError
from prism.graph.records import CommOp, GroupInfo, Graph, Node, NodeKind, RankSummary

__all__ = ["format_node", "parse_node", "format_graph", "parse_graph"]

_KIND_WORD = {
    NodeKind.COMPUTE: "COMP",
    NodeKind.COLLECTIVE: "COLL",
    NodeKind.SEND: "SEND",
    NodeKind.RECV: "RECV",
    NodeKind.WAIT: "WAIT",
    NodeKind.MARK: "MARK",
}
_WORD_KIND = {w: k for k, w in _KIND_WORD.items()}
_IMPLIED_OP = {NodeKind.SEND: CommOp.SEND, NodeKind.RECV: CommOp.RECV}
_OPS = {op.value: op for op in CommOp}
_REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"})
_MARKS = frozenset({"step_begin", "step_end"})
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_SIZE_RE = re.compile(r"^(\d+)(B|KiB|MiB|GiB)$")
_TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME_RE = re.compile(r"^(-?\d+)(ns|us|ms|s)?$")
_HEAD_RE = re.compile(r"^r(\d+)(?:#(\d+))?$")
_TENSORS_RE = re.compile(r"^([a-z?][a-z0-9_]*)((?:\[[0-9,\-]*\])*)$")
_SHAPE_RE = re.compile(r"\[([0-9,\-]*)\]")


# --- strings -------------------------------------------------------------------------------------


def _esc(s: str) -> str:
    return (
        s.replace("%", "%25")
        .replace(" ", "%20")
        .replace("=", "%3D")
        .replace("\t", "%09")
        .replace("\n", "%0A")
    )


def _unesc(s: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), s)


def _ints(s: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",")) if s else ()
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {s!r}") from None


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> str:
    return "".join("[" + ",".join(str(d) for d in shape) + "]" for shape in shapes)


def _parse_shapes(s: str) -> tuple[tuple[int, ...], ...]:
    return tuple(_ints(m.group(1), "shape") for m in _SHAPE_RE.finditer(s))


def _size(n: int) -> str:
    for unit, scale in _UNITS:
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _time(s: str) -> int:
    m = _TIME_RE.match(s)
    if not m:
        raise ValueError(f"bad time {s!r} (expected an integer, optionally with ns/us/ms/s)")
    return int(m.group(1)) * _TIME_UNITS[m.group(2) or "ns"]


# --- nodes ---------------------------------------------------------------------------------------


def format_node(node: Node) -> str:
    """The one-line print form of ``node`` (see the module docstring for the grammar)."""
    out = [f"r{node.rank}#{node.index}", _KIND_WORD[node.kind]]
    implied = _IMPLIED_OP.get(node.kind)
    if node.op is not None and node.op is not implied:
        out.append(node.op.value)
    elif node.op is None and implied is not None:
        out.append("op=none")
    if node.group_id or node.seq != -1:
        out.append(f"g{_esc(node.group_id)}:{'' if node.seq == -1 else node.seq}")
    if node.peer != -1:
        arrow = {NodeKind.SEND: "->", NodeKind.RECV: "<-"}.get(node.kind)
        out.append(f"{arrow}{node.peer}" if arrow else f"root={node.peer}")
    if node.tag:
        out.append(f"tag={node.tag}")
    if node.size_bytes:
        out.append(_size(node.size_bytes))
    if node.dtype or node.shapes:
        out.append((node.dtype or "?") + _shapes(node.shapes))
    if node.out_shapes:
        out.append("out" + _shapes(node.out_shapes))
    if node.in_splits:
        out.append("in_splits=" + ",".join(map(str, node.in_splits)))
    if node.out_splits:
        out.append("out_splits=" + ",".join(map(str, node.out_splits)))
    if node.reduce_op:
        out.append(node.reduce_op if node.reduce_op in _REDUCE_OPS else f"reduce={_esc(node.reduce_op)}")
    if node.is_async:
        out.append("async")
    if node.call_site:
        out.append("@" + _esc(node.call_site))
    if node.target != -1:
        out.append(f"#{node.target}")
    if node.mark:
        out.append(node.mark if node.mark in _MARKS else f"mark={_esc(node.mark)}")
    if node.step != -1:
        out.append(f"step={node.step}")
    if node.start_ns != -1:
        out.append(f"t={node.start_ns}" + ("" if node.duration_ns == -1 else f"+{node.duration_ns}"))
    elif node.duration_ns != -1:
        out.append(f"d={node.duration_ns}")
    if node.payload:
        out.append("payload=" + _esc(node.payload))
    return " ".join(out)


def parse_node(line: str, *, default_index: int | None = None) -> Node:
    """Parse one node line. ``default_index`` is used when the head is ``r3`` without ``#index``."""
    try:
        return _parse_node(line.split(), default_index)
    except ValueError as e:
        raise GraphError(f"cannot parse node line {line.strip()!r}: {e}") from None


def _parse_node(tokens: list[str], default_index: int | None) -> Node:
    if len(tokens) < 2:
        raise ValueError("expected 'r<rank>#<index> KIND ...'")
    head = _HEAD_RE.match(tokens[0])
    if not head:
        raise ValueError(f"bad head {tokens[0]!r} (expected r<rank>#<index>)")
    if head.group(2) is None and default_index is None:
        raise ValueError(f"head {tokens[0]!r} has no #index")
    kind = _WORD_KIND.get(tokens[1])
    if kind is None:
        raise ValueError(f"unknown kind {tokens[1]!r} (one of {', '.join(_WORD_KIND)})")
    f: dict[str, object] = {
        "rank": int(head.group(1)),
        "index": int(head.group(2)) if head.group(2) is not None else default_index,
        "kind": kind,
        "op": _IMPLIED_OP.get(kind),
    }
    for tok in tokens[2:]:
        key, eq, value = tok.partition("=")
        if tok in _OPS:
            f["op"] = _OPS[tok]
        elif tok == "op=none":
            f["op"] = None
        elif tok == "async":
            f["is_async"] = True
        elif tok in _REDUCE_OPS:
            f["reduce_op"] = tok
        elif tok in _MARKS:
            f["mark"] = tok
        elif tok.startswith("->") or tok.startswith("<-"):
            f["peer"] = int(tok[2:])
        elif tok.startswith("@"):
            f["call_site"] = _unesc(tok[1:])
        elif tok.startswith("#"):
            f["target"] = int(tok[1:])
        elif tok.startswith("g") and ":" in tok and not eq:
            group, _, seq = tok[1:].rpartition(":")
            f["group_id"] = _unesc(group)
            f["seq"] = int(seq) if seq else -1
        elif tok.startswith("out["):
            f["out_shapes"] = _parse_shapes(tok[3:])
        elif eq:
            _parse_keyed(f, key, value, tok)
        elif m := _SIZE_RE.match(tok):
            f["size_bytes"] = int(m.group(1)) * dict(_UNITS).get(m.group(2), 1)
        elif m := _TENSORS_RE.match(tok):
            f["dtype"] = "" if m.group(1) == "?" else m.group(1)
            f["shapes"] = _parse_shapes(m.group(2))
        else:
            raise ValueError(f"unknown token {tok!r}")
    return Node(**f)  # type: ignore[arg-type]


def _parse_keyed(f: dict[str, object], key: str, value: str, tok: str) -> None:
    if key == "root":
        f["peer"] = int(value)
    elif key in ("tag", "step"):
        f[key] = int(value)
    elif key in ("in_splits", "out_splits"):
        f[key] = _ints(value, key)
    elif key == "reduce":
        f["reduce_op"] = _unesc(value)
    elif key in ("mark", "payload"):
        f[key] = _unesc(value)
    elif key == "d":
        f["duration_ns"] = _time(value)
    elif key == "t":
        start, plus, duration = value.partition("+")
        f["start_ns"] = -1 if start == "?" else _time(start)
        if plus:
            f["duration_ns"] = _time(duration)
    else:
        raise ValueError(f"unknown token {tok!r}")


# --- graphs --------------------------------------------------------------------------------------


def format_graph(graph: Graph) -> str:
    """The multi-line text form: header, meta, groups, nodes (rank, index order), summaries."""
    head = f"graph world_size={graph.world_size} kind={_esc(graph.kind)}"
    lines = [head + (f" job_name={_esc(graph.job_name)}" if graph.job_name else "")]
    lines += [f"meta {_esc(k)}={_esc(v)}" for k, v in sorted(graph.meta.items())]
    for g in graph.groups.values():
        desc = f" desc={_esc(g.desc)}" if g.desc else ""
        lines.append(f"group {_esc(g.group_id)} ranks={','.join(map(str, g.ranks))}{desc}")
    for rank in sorted(graph.nodes):
        lines += [format_node(n) for n in graph.nodes[rank]]
    for rank in sorted(graph.summaries):
        lines.append(_format_summary(graph.summaries[rank]))
    return "\n".join(lines) + "\n"


def _format_summary(s: RankSummary) -> str:
    out = [f"summary r{s.rank}"]
    if s.step_times_ns:
        out.append("step_times_ns=" + ",".join(map(str, s.step_times_ns)))
    if s.losses:
        out.append("losses=" + ",".join(repr(x) for x in s.losses))
    if s.peak_memory_bytes != -1:
        out.append(f"peak_memory_bytes={s.peak_memory_bytes}")
    if s.measured_peak_memory_bytes != -1:
        out.append(f"measured_peak_memory_bytes={s.measured_peak_memory_bytes}")
    if s.memory_source:
        out.append(f"memory_source={_esc(s.memory_source)}")
    if s.exit_code:
        out.append(f"exit_code={s.exit_code}")
    return " ".join(out)


def parse_graph(text: str | Iterable[str]) -> Graph:
    """Parse the multi-line form. Node lines may come in any rank order but, within a rank, in
    index order starting at 0; ``r3 KIND ...`` (no ``#index``) takes the next index.

    Without a ``graph`` line, world_size is one more than the highest rank named anywhere.
    """
    lines = text.splitlines() if isinstance(text, str) else list(text)
    world_size: int | None = None
    header: dict[str, str] = {}
    meta: dict[str, str] = {}
    groups: dict[str, GroupInfo] = {}
    nodes: dict[int, list[Node]] = {}
    summaries: dict[int, RankSummary] = {}
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        try:
            if word == "graph":
                header = _pairs(rest)
                world_size = int(header.pop("world_size"))
            elif word == "meta":
                meta.update(_pairs(rest))
            elif word == "group":
                gid, _, rest = rest.partition(" ")
                kv = _pairs(rest)
                gid = _unesc(gid)
                groups[gid] = GroupInfo(gid, _ints(kv.get("ranks", ""), "ranks"), kv.get("desc", ""))
            elif word == "summary":
                s = _parse_summary(word_rank=rest.partition(" ")[0], kv=_pairs(rest.partition(" ")[2]))
                summaries[s.rank] = s
            elif _HEAD_RE.match(word):
                rank = int(_HEAD_RE.match(word).group(1))  # type: ignore[union-attr]
                own = nodes.setdefault(rank, [])
                node = _parse_node(line.split(), default_index=len(own))
                if node.index != len(own):
                    raise ValueError(f"r{rank} index {node.index} out of order (expected #{len(own)})")
                own.append(node)
            else:
                raise ValueError(f"unknown line kind {word!r}")
        except (ValueError, KeyError) as e:
            raise GraphError(f"graph text line {lineno}: {line!r}: {e}") from None
    named = set(nodes) | set(summaries) | {r for g in groups.values() for r in g.ranks}
    if world_size is None:
        world_size = max(named, default=-1) + 1
    if named and max(named) >= world_size:
        raise GraphError(f"graph text names rank {max(named)} but world_size is {world_size}")
    return Graph(
        world_size=world_size,
        nodes={r: tuple(nodes.get(r, ())) for r in range(world_size)},
        groups=groups,
        summaries=summaries,
        kind=header.get("kind", "real"),
        job_name=header.get("job_name", ""),
        meta=meta,
    )


def _pairs(s: str) -> dict[str, str]:
    out = {}
    for tok in s.split():
        key, eq, value = tok.partition("=")
        if not eq:
            raise ValueError(f"expected key=value, got {tok!r}")
        out[_unesc(key)] = _unesc(value)
    return out


def _parse_summary(word_rank: str, kv: dict[str, str]) -> RankSummary:
    m = _HEAD_RE.match(word_rank)
    if not m or m.group(2) is not None:
        raise ValueError(f"expected 'summary r<rank> ...', got {word_rank!r}")
    unknown = set(kv) - {"step_times_ns", "losses", "peak_memory_bytes", "measured_peak_memory_bytes", "memory_source",
                         "exit_code"}
    if unknown:
        raise ValueError(f"unknown summary field(s) {sorted(unknown)}")
    return RankSummary(
        rank=int(m.group(1)),
        losses=tuple(float(x) for x in kv["losses"].split(",")) if kv.get("losses") else (),
        step_times_ns=_ints(kv.get("step_times_ns", ""), "step_times_ns"),
        peak_memory_bytes=int(kv.get("peak_memory_bytes", -1)),
        memory_source=kv.get("memory_source", ""),
        exit_code=int(kv.get("exit_code", 0)),
        measured_peak_memory_bytes=int(kv.get("measured_peak_memory_bytes", -1)),
    )
