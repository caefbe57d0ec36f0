"""DP templates (DESIGN §5): one DP replica's graph stands for all of them.

Ranks that differ only in their data-parallel coordinate (same PP/TP/CP coordinates, hence the
same EP shard) run the same program up to a renaming of ranks and groups. A templated graph
keeps the node lists of one replica (the *template ranks*, DP coordinate 0) and a
:class:`~prism.graph.records.TemplateMap`; :func:`expand` rebuilds every rank's node list:

* rank r = ``rank_maps[d][t]`` runs template t's nodes (d = r's replica);
* a group is renamed to the group whose members are the renamed members, in order
  (``group_maps[d]``); a group that spans the replicas (the DP groups, the world) has the same
  members as a set and maps to itself;
* a P2P peer is renamed with the permutation; the root of a rooted collective (broadcast, reduce,
  gather, scatter) keeps its *group rank* (in a group that spans the replicas every member names
  the same global root);
* payload hashes and losses stay on the template ranks: values of the other replicas were not
  collected (in a real run they differ: each replica reads other data). Step times and peak memory
  are the template's.

Rank coordinates follow ``parallelism.mesh`` (outermost first, default ``pp, dp, cp, tp`` as in
``init_device_mesh(device, (pp, dp, tp))``): ``rank = ((pp*DP + dp)*CP + cp)*TP + tp``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence

from prism.core.errors import GraphError

from .records import CommOp, Graph, GroupInfo, Node, NodeKind, RankSummary, TemplateMap

__all__ = ["dp_permutations", "build_template_map", "expand", "ROOTED_OPS"]

log = logging.getLogger(__name__)

ROOTED_OPS = frozenset({CommOp.BROADCAST, CommOp.REDUCE, CommOp.GATHER, CommOp.SCATTER})


def dp_permutations(sizes: Mapping[str, int], mesh: Sequence[str]) -> list[tuple[int, ...]]:
    """For each DP replica d, the permutation of the world that shifts every rank's DP coordinate
    by d (``perm[d][r]``); replica d's ranks are ``perm[d][t]`` for the template ranks t (DP 0)."""
    dims = [sizes[name] for name in mesh]
    world = 1
    for n in dims:
        world *= n
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    k = list(mesh).index("dp")
    num_dp, stride = dims[k], strides[k]
    perms = []
    for d in range(num_dp):
        perm = []
        for r in range(world):
            c = (r // stride) % num_dp
            perm.append(r + (((c + d) % num_dp) - c) * stride)
        perms.append(tuple(perm))
    return perms


def build_template_map(perms: Sequence[tuple[int, ...]], template_groups: Iterable[GroupInfo],
                       known_groups: Iterable[GroupInfo]) -> tuple[TemplateMap, dict[str, GroupInfo]]:
    """The template map for the replicas ``perms`` and the groups the expansion needs.

    ``template_groups``: groups the template ranks use. ``known_groups``: every group any
    template rank saw created (members or not). A renamed group that no rank saw gets the id
    ``<template id>@dp<d>`` (with a warning: an emulation of that replica would not find it).
    """
    world = len(perms[0])
    template_of, replica_of = [0] * world, [0] * world
    templates = [r for r in range(world) if _is_template(perms, r)]
    for d, perm in enumerate(perms):
        for t in templates:
            template_of[perm[t]], replica_of[perm[t]] = t, d
    by_members: dict[tuple[int, ...], GroupInfo] = {}
    by_set: dict[frozenset[int], GroupInfo] = {}
    for g in known_groups:
        by_members.setdefault(g.ranks, g)
        by_set.setdefault(frozenset(g.ranks), g)
    groups: dict[str, GroupInfo] = {}
    group_maps: list[dict[str, str]] = []
    for d, perm in enumerate(perms):
        mapping = {}
        for g in template_groups:
            groups.setdefault(g.group_id, g)
            members = tuple(perm[m] for m in g.ranks)
            found = g if d == 0 else by_members.get(members) or by_set.get(frozenset(members))
            if found is None:
                found = GroupInfo(f"{g.group_id}@dp{d}", members, g.desc)
                log.warning("DP templates: no rank saw the group of ranks %s (replica %d of group %s); named it %s",
                            list(members), d, g.group_id, found.group_id)
            mapping[g.group_id] = found.group_id
            groups.setdefault(found.group_id, found)
        group_maps.append(mapping)
    tmap = TemplateMap(template_of=tuple(template_of), replica_of=tuple(replica_of), rank_maps=tuple(perms),
                       group_maps=tuple(group_maps))
    return tmap, groups


def _is_template(perms: Sequence[tuple[int, ...]], r: int) -> bool:
    """Template ranks are the ranks with DP coordinate 0: no shift maps another rank onto them
    from a lower DP coordinate, i.e. r is the smallest rank of its orbit."""
    return r == min(p[r] for p in perms)


def _rename(n: Node, rank: int, d: int, tmap: TemplateMap, groups: Mapping[str, GroupInfo]) -> Node:
    perm, gmap = tmap.rank_maps[d], tmap.group_maps[d]
    changes: dict = {"rank": rank, "payload": ""}
    if n.group_id:
        gid = gmap.get(n.group_id)
        if gid is None:
            raise GraphError(f"template rank {n.rank} node #{n.index}: group {n.group_id} has no renaming "
                             f"for replica {d} in the manifest")
        changes["group_id"] = gid
        if n.peer >= 0 and n.is_comm:
            if n.kind in (NodeKind.SEND, NodeKind.RECV):
                changes["peer"] = perm[n.peer]
            elif n.op in ROOTED_OPS:
                k = groups[n.group_id].ranks.index(n.peer)
                changes["peer"] = groups[gid].ranks[k]
    return dataclasses.replace(n, **changes)


def expand(graph: Graph) -> Graph:
    """Every rank's node list from a templated graph (a graph without templates comes back as is)."""
    tmap = graph.templates
    if tmap is None:
        return graph
    if len(tmap.template_of) != graph.world_size:
        raise GraphError(f"template map covers {len(tmap.template_of)} ranks, the graph {graph.world_size}")
    missing = sorted(set(tmap.template_ranks) - set(graph.nodes))
    if missing:
        raise GraphError(f"templated graph lacks the node lists of template ranks {missing}")
    nodes: dict[int, tuple[Node, ...]] = {}
    summaries: dict[int, RankSummary] = {}
    for rank in range(graph.world_size):
        t, d = tmap.template_of[rank], tmap.replica_of[rank]
        if rank == t:
            nodes[rank] = graph.nodes[t]
            if t in graph.summaries:
                summaries[rank] = graph.summaries[t]
            continue
        nodes[rank] = tuple(_rename(n, rank, d, tmap, graph.groups) for n in graph.nodes[t])
        s = graph.summaries.get(t)
        if s is not None:
            summaries[rank] = dataclasses.replace(s, rank=rank, losses=())
    used = {n.group_id for ns in nodes.values() for n in ns if n.group_id}
    groups = {gid: g for gid, g in graph.groups.items() if gid in used}
    meta = {**graph.meta, "templates": tmap.kind, "num_replicas": str(tmap.num_replicas),
            "template_ranks": ",".join(map(str, tmap.template_ranks))}
    return dataclasses.replace(graph, nodes=nodes, summaries=summaries, groups=groups, meta=meta, templates=None)
