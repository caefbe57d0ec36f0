"""Recorded data of a sandbox set derived from the data of a larger set.

A collection records pruned-collective data for ``values.ranks`` (say 0-7). An emulation of a
subset (ranks 2,5) needs the data of that subset: the entry partials of *its* ring blocks and the
subtree partials of *its* vrank children. :meth:`RecordedCollective.restrict` computes them from
the larger set's record alone, bit for bit what the collector would have stored for the subset,
so no re-collection is needed. :func:`derive_subset` does it for a whole directory, once, and
writes ``RUN/payloads/pruned/<subset>/`` atomically (built beside it, then renamed).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from prism.core.errors import RunDirError

from .recorded_store import load_recorded, read_index, save_recorded, set_key, write_index

__all__ = ["find_superset_dir", "derive_subset"]

log = logging.getLogger(__name__)


def _ranks_of(directory: Path) -> frozenset[int] | None:
    name = directory.name
    if not name.startswith("ranks-"):
        return None
    try:
        return frozenset(int(r) for r in name[len("ranks-"):].split("_"))
    except ValueError:
        return None


def find_superset_dir(pruned_root: str | Path, ranks: Iterable[int]) -> Path | None:
    """The smallest recorded set under ``pruned_root`` (RUN/payloads/pruned) that contains ``ranks``
    and has an index (a finished collection); None if there is none."""
    want = frozenset(ranks)
    best: tuple[int, Path] | None = None
    root = Path(pruned_root)
    if not root.is_dir():
        return None
    for d in root.iterdir():
        have = _ranks_of(d)
        if have is None or not want <= have or not (d / "index.json").is_file():
            continue
        if best is None or len(have) < best[0]:
            best = (len(have), d)
    return best[1] if best else None


def _group_ranks(key: str, members: Sequence[int], ranks: frozenset[int]) -> list[int]:
    kind, _group, *rest = key.split("/")
    if kind == "p":  # the two endpoints of a message; its record is over the group's ranks
        src, dst = (int(x) for x in rest[0].split("-"))
        return [g for g, m in enumerate(members) if m in (src, dst) and m in ranks]
    return [g for g, m in enumerate(members) if m in ranks]


def derive_subset(source: str | Path, ranks: Iterable[int], groups: Mapping[str, Sequence[int]]) -> Path:
    """Write the recorded data of ``ranks`` (logical) next to ``source`` (a larger set's directory)
    and return its path. ``groups``: group id -> member ranks (the graph's groups)."""
    source = Path(source)
    ranks = frozenset(ranks)
    have = _ranks_of(source)
    if have is None or not ranks <= have:
        raise RunDirError(f"{source}: not recorded data of a superset of ranks {sorted(ranks)}")
    target = source.parent / set_key(ranks)
    if target.is_dir():
        return target
    building = source.parent / f".{target.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    keys = list(read_index(source))  # checked; missing: the run that wrote the set did not finish
    try:
        kept = _restrict_all(source, keys, building, ranks, groups)
        building.mkdir(parents=True, exist_ok=True)
        write_index(building)
        building.replace(target)
    finally:
        shutil.rmtree(building, ignore_errors=True)  # a failed derivation leaves nothing behind
    log.info("derived the recorded data of ranks %s from %s: %d of %d records", sorted(ranks), source.name,
             kept, len(keys))
    return target


def _restrict_all(source: Path, keys: list[str], building: Path, ranks: frozenset[int],
                  groups: Mapping[str, Sequence[int]]) -> int:
    kept = 0
    for key in keys:
        group_id = key.split("/")[1]
        if group_id not in groups:
            raise RunDirError(f"{source}: record {key} names group {group_id!r}, which the graph does not have")
        subset = _group_ranks(key, groups[group_id], ranks)
        if not subset:
            continue  # no rank of the subset takes part
        rec = load_recorded(source, key, indexed=True)
        assert rec is not None, key  # an indexed record that is gone raises
        save_recorded(building, key, rec.restrict(subset))
        kept += 1
    return kept
