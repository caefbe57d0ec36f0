"""Read and write a PrismTrace graph directory (protos/prism_trace.proto).

Layout::

    DIR/manifest.pb        Manifest: schema_version, world size, groups, one RankFileRef per rank
    DIR/rank-00003.pb      RankFile: rank 3's nodes, its summary, the sha256 of its node payload

The manifest carries the sha256 of every rank file's bytes and of itself (``Manifest.sha256``:
the manifest serialized with that field empty); every file carries the schema version. A write is
atomic (the directory appears whole or not at all); a read checks versions and checksums and names
the offending file, what is wrong and the command that writes it again in an IntegrityError (a
RunDirError).

DP templates (``prism.graph.templates``): a templated graph stores rank files for the template
ranks only, plus ``Manifest.templates`` (rank -> template, per replica the rank and group
renaming). :func:`read_graph` expands it, so every reader sees one node list per rank;
``read_graph(..., expand=False)`` returns the stored form.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from prism.core.atomic import atomic_directory
from prism.core.errors import IntegrityError, RunDirError
from prism.graph._pb import prism_trace_pb2 as pb
from prism.graph.records import CommOp, GroupInfo, Graph, Node, NodeKind, RankSummary, TemplateMap
from prism.graph.templates import expand as expand_templates

__all__ = ["SCHEMA_VERSION", "MANIFEST_NAME", "rank_file_name", "write_graph", "read_graph", "verify_graph"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Version of the on-disk layout; bump it on any incompatible change to prism_trace.proto.
2: the manifest carries its own sha256."""
MANIFEST_NAME = "manifest.pb"

_KIND_TO_PB = {k: pb.NodeKind.Value(f"NODE_KIND_{k.name}") for k in NodeKind}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_OP_TO_PB = {op: pb.CommOp.Value(f"COMM_OP_{op.name}") for op in CommOp}
_OP_FROM_PB = {v: k for k, v in _OP_TO_PB.items()}


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pb"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_sha256(manifest: pb.Manifest) -> str:
    body = pb.Manifest()
    body.CopyFrom(manifest)
    body.ClearField("sha256")
    return _sha256(body.SerializeToString(deterministic=True))


_WRITERS = {"bare": "prism collect", "timed": "prism calibrate", "real": "prism record"}


def _remedy(root: Path) -> str:
    command = _WRITERS.get(root.name)
    return f"re-run `{command}` to write {root} again" if command else f"write {root} again"


def _nodes_sha256(nodes: object) -> str:
    h = hashlib.sha256()
    for n in nodes:  # type: ignore[attr-defined]
        h.update(n.SerializeToString(deterministic=True))
    return h.hexdigest()


# --- records -> messages -------------------------------------------------------------------------


def _node_to_pb(n: Node) -> pb.Node:
    m = pb.Node(
        kind=_KIND_TO_PB[n.kind],
        op=_OP_TO_PB[n.op] if n.op is not None else pb.COMM_OP_UNSPECIFIED,
        group_id=n.group_id,
        seq=n.seq,
        peer=n.peer,
        tag=n.tag,
        size_bytes=n.size_bytes,
        dtype=n.dtype,
        in_splits=n.in_splits,
        out_splits=n.out_splits,
        reduce_op=n.reduce_op,
        is_async=n.is_async,
        call_site=n.call_site,
        target=n.target,
        mark=n.mark,
        step=n.step,
        start_ns=n.start_ns,
        duration_ns=n.duration_ns,
        payload=n.payload,
    )
    for shape in n.shapes:
        m.shapes.add(dims=shape)
    for shape in n.out_shapes:
        m.out_shapes.add(dims=shape)
    return m


def _summary_to_pb(s: RankSummary) -> pb.RankSummary:
    return pb.RankSummary(
        rank=s.rank,
        losses=s.losses,
        step_times_ns=s.step_times_ns,
        peak_memory_bytes=s.peak_memory_bytes,
        memory_source=s.memory_source,
        exit_code=s.exit_code,
        measured_peak_memory_bytes=s.measured_peak_memory_bytes,
    )


def write_graph(graph: Graph, directory: str | os.PathLike[str]) -> Path:
    """Write ``graph`` to ``directory`` atomically (replacing it as a whole); return the path."""
    target = Path(directory)
    manifest = pb.Manifest(
        schema_version=SCHEMA_VERSION,
        world_size=graph.world_size,
        kind=graph.kind,
        job_name=graph.job_name,
        meta=graph.meta,
    )
    for g in graph.groups.values():
        manifest.groups.add(group_id=g.group_id, ranks=g.ranks, desc=g.desc)
    ranks = sorted(graph.nodes)
    if graph.templates is not None:
        _templates_to_pb(graph.templates, manifest.templates)
        ranks = [r for r in ranks if graph.templates.template_of[r] == r]
    with atomic_directory(target) as tmp:
        for rank in ranks:
            nodes = graph.nodes[rank]
            rank_file = pb.RankFile(schema_version=SCHEMA_VERSION, rank=rank)
            rank_file.nodes.extend(_node_to_pb(n) for n in nodes)
            rank_file.nodes_sha256 = _nodes_sha256(rank_file.nodes)
            summary = graph.summaries.get(rank)
            if summary is not None:
                rank_file.summary.CopyFrom(_summary_to_pb(summary))
                rank_file.has_summary = True
            data = rank_file.SerializeToString(deterministic=True)
            name = rank_file_name(rank)
            (tmp / name).write_bytes(data)
            manifest.rank_files.add(
                rank=rank, file_name=name, sha256=_sha256(data), size_bytes=len(data), num_nodes=len(nodes)
            )
        manifest.sha256 = _manifest_sha256(manifest)
        (tmp / MANIFEST_NAME).write_bytes(manifest.SerializeToString(deterministic=True))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    log.debug("wrote graph (%d ranks) to %s", len(graph.nodes), target)
    return target


def _templates_to_pb(t: TemplateMap, m: pb.Templates) -> None:
    m.kind = t.kind
    m.template_of.extend(t.template_of)
    m.replica_of.extend(t.replica_of)
    for perm, groups in zip(t.rank_maps, t.group_maps, strict=True):
        replica = m.replicas.add(rank_map=perm)
        replica.group_map.update(groups)


def _templates_from_pb(m: pb.Templates, world_size: int, path: Path) -> TemplateMap:
    t = TemplateMap(template_of=tuple(m.template_of), replica_of=tuple(m.replica_of),
                    rank_maps=tuple(tuple(r.rank_map) for r in m.replicas),
                    group_maps=tuple(dict(r.group_map) for r in m.replicas), kind=m.kind)
    if len(t.template_of) != world_size or len(t.replica_of) != world_size or not t.rank_maps or any(
            sorted(perm) != list(range(world_size)) for perm in t.rank_maps):
        raise RunDirError(f"{path}: the template map does not cover the {world_size} ranks")
    for rank in range(world_size):
        d, tr = t.replica_of[rank], t.template_of[rank]
        if not 0 <= d < t.num_replicas or t.rank_maps[d][tr] != rank:
            raise RunDirError(f"{path}: the template map sends rank {rank} to template {tr} of replica {d}, "
                              "but that replica's rank map disagrees")
    return t


# --- messages -> records -------------------------------------------------------------------------


def _node_from_pb(rank: int, index: int, m: pb.Node) -> Node:
    return Node(
        rank=rank,
        index=index,
        kind=_KIND_FROM_PB[m.kind],
        op=_OP_FROM_PB.get(m.op),
        group_id=m.group_id,
        seq=m.seq,
        peer=m.peer,
        tag=m.tag,
        size_bytes=m.size_bytes,
        dtype=m.dtype,
        shapes=tuple(tuple(s.dims) for s in m.shapes),
        out_shapes=tuple(tuple(s.dims) for s in m.out_shapes),
        in_splits=tuple(m.in_splits),
        out_splits=tuple(m.out_splits),
        reduce_op=m.reduce_op,
        is_async=m.is_async,
        call_site=m.call_site,
        target=m.target,
        mark=m.mark,
        step=m.step,
        start_ns=m.start_ns,
        duration_ns=m.duration_ns,
        payload=m.payload,
    )


def _summary_from_pb(m: pb.RankSummary) -> RankSummary:
    return RankSummary(
        rank=m.rank,
        losses=tuple(m.losses),
        step_times_ns=tuple(m.step_times_ns),
        peak_memory_bytes=m.peak_memory_bytes,
        memory_source=m.memory_source,
        exit_code=m.exit_code,
        measured_peak_memory_bytes=(m.measured_peak_memory_bytes if m.HasField("measured_peak_memory_bytes")
                                    else -1),
    )


def _read(path: Path, what: str, remedy: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, f"{what} is missing", remedy) from None
    except OSError as e:
        raise IntegrityError(path, f"cannot read {what}: {e}", remedy) from e


def _parse(message: pb.Manifest | pb.RankFile, data: bytes, path: Path, remedy: str) -> None:
    try:
        message.ParseFromString(data)
    except DecodeError as e:
        raise IntegrityError(path, f"corrupt or truncated {type(message).__name__} ({e})", remedy) from e


def _check_version(version: int, path: Path, remedy: str) -> None:
    if version != SCHEMA_VERSION:
        raise RunDirError(
            f"{path}: schema_version {version}, but this prism reads schema_version {SCHEMA_VERSION}; {remedy}"
        )


def _verified_manifest(root: Path, remedy: str) -> pb.Manifest:
    if not root.is_dir():
        raise RunDirError(f"{root}: graph directory does not exist")
    manifest_path = root / MANIFEST_NAME
    manifest = pb.Manifest()
    _parse(manifest, _read(manifest_path, "the graph manifest", remedy), manifest_path, remedy)
    _check_version(manifest.schema_version, manifest_path, remedy)
    got = _manifest_sha256(manifest)
    if got != manifest.sha256:
        raise IntegrityError(manifest_path, f"sha256 mismatch: the manifest hashes to {got}, it says "
                             f"{manifest.sha256 or 'nothing'} (the file was modified or corrupted)", remedy)
    return manifest


def _verified_rank_files(root: Path, manifest: pb.Manifest, remedy: str) -> Iterator[tuple[Any, Path, bytes]]:
    """Each rank file's manifest entry, path and bytes, checked against the manifest."""
    for ref in manifest.rank_files:
        path = root / ref.file_name
        if Path(ref.file_name).name != ref.file_name:
            raise RunDirError(f"{root / MANIFEST_NAME}: rank {ref.rank} file name {ref.file_name!r} is not plain")
        data = _read(path, f"rank {ref.rank}'s file (listed in {MANIFEST_NAME})", remedy)
        if len(data) < ref.size_bytes:
            raise IntegrityError(path, f"truncated ({len(data)} of {ref.size_bytes} bytes)", remedy)
        if _sha256(data) != ref.sha256:
            raise IntegrityError(
                path, f"sha256 {_sha256(data)} does not match {MANIFEST_NAME} "
                f"({ref.sha256}); the file is corrupt or was replaced", remedy)
        yield ref, path, data


def verify_graph(directory: str | os.PathLike[str]) -> None:
    """Check a graph directory without parsing its nodes: the manifest reads, and every rank file
    it lists is there with its size and sha256. Cheap enough to run before starting any process
    that will read the graph, so a damaged file stops a command at once, named, not in a worker."""
    root = Path(directory)
    remedy = _remedy(root)
    for _ in _verified_rank_files(root, _verified_manifest(root, remedy), remedy):
        pass


def read_graph(directory: str | os.PathLike[str], *, expand: bool = True) -> Graph:
    """Read a graph written by :func:`write_graph`, verifying versions and checksums.

    A DP-templated graph comes back expanded into every rank's node list (``expand=False``: as
    stored, template ranks only, with ``Graph.templates``)."""
    root = Path(directory)
    remedy = _remedy(root)
    manifest_path = root / MANIFEST_NAME
    manifest = _verified_manifest(root, remedy)
    nodes: dict[int, tuple[Node, ...]] = {}
    summaries: dict[int, RankSummary] = {}
    for ref, path, data in _verified_rank_files(root, manifest, remedy):
        rank_file = pb.RankFile()
        _parse(rank_file, data, path, remedy)
        _check_version(rank_file.schema_version, path, remedy)
        if rank_file.rank != ref.rank:
            raise RunDirError(f"{path}: holds rank {rank_file.rank}, the manifest says rank {ref.rank}")
        if _nodes_sha256(rank_file.nodes) != rank_file.nodes_sha256:
            raise IntegrityError(path, "node payload checksum mismatch", remedy)
        rank = ref.rank
        nodes[rank] = tuple(_node_from_pb(rank, i, m) for i, m in enumerate(rank_file.nodes))
        if rank_file.has_summary:
            summaries[rank] = _summary_from_pb(rank_file.summary)

    groups = {
        g.group_id: GroupInfo(g.group_id, tuple(g.ranks), g.desc) for g in manifest.groups
    }
    templates = (_templates_from_pb(manifest.templates, manifest.world_size, manifest_path)
                 if manifest.HasField("templates") else None)
    if templates is not None and sorted(nodes) != list(templates.template_ranks):
        raise RunDirError(f"{manifest_path}: holds rank files {sorted(nodes)}, the template map names template "
                          f"ranks {list(templates.template_ranks)}")
    graph = Graph(
        world_size=manifest.world_size,
        nodes=nodes,
        groups=groups,
        summaries=summaries,
        kind=manifest.kind,
        job_name=manifest.job_name,
        meta=dict(manifest.meta),
        templates=templates,
    )
    return expand_templates(graph) if expand else graph
