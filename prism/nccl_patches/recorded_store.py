"""Recorded data of pruned collectives for one sandbox set, on disk.

Layout (one safetensors file per pruned collective, written atomically; the tensors of a
:class:`RecordedCollective` and its scalar fields in the file's metadata)::

    RUN/payloads/pruned/<set key>/c/<group_id>/<seq>.<part>.safetensors          collectives
    RUN/payloads/pruned/<set key>/p/<group_id>/<src>-<dst>.<seq>.<part>.safetensors   send/recv
    RUN/payloads/pruned/<set key>/index.json      key -> file, algo, group size (write_index)

Integrity: every record carries in its metadata ``sha256`` (:func:`record_sha256`) and
``tensor_sha256``, each tensor's own digest (name, dtype, shape, bytes); ``sha256`` is the digest of
the other metadata, those digests included, written in the same atomic write as the data and
checked by :func:`load_recorded`, which checks each tensor it reads against its digest (a sandbox
rank reads only its own input; records written before ``tensor_sha256``: the digest of every
tensor and the other metadata, read whole); the index carries the sha256 of its
content, and :class:`RecordedStore` requires it (a set without one was not finished) and treats
an indexed record that is gone as an error. The capture run's ``rank-R.json`` carries the sha256
of ``rank-R.safetensors`` and of itself (:data:`CAPTURE_SCHEMA` 2), checked when first read.

Keys are ``c/<group_id>/<seq>/<part>`` and ``p/<group_id>/<src>-<dst>/<seq>/<part>`` (global
ranks, per-pair sequence): the graph identities plus the part (one per tensor of a coalesced op,
:func:`~prism.nccl_patches.vplan.op_parts`). The set key names the sandbox ranks the data was
recorded for (``values.ranks`` at collect time); an emulation must use that same set.

Writers: the collector calls :func:`record_for_values_ranks` / :func:`record_p2p_for_values_ranks`
once per resolved op; :func:`derive_from_capture` computes the same files offline from a capture
run (every rank's inputs, :mod:`prism.sandbox.engines.live` with ``capture_dir``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from urllib.parse import quote, unquote

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from prism.core.atomic import atomic_write_text
from prism.core.errors import IntegrityError, PrismError, RunDirError
from prism.core.integrity import dumps_checked, load_checked, safetensors_problem
from prism.core.tensorfile import read_safetensors
from prism.graph.records import CommOp

from .compensation import RecordedCollective, record_for_sandbox
from .schedule import Algo
from .vplan import op_parts

__all__ = [
    "set_key",
    "recorded_dir",
    "collective_key",
    "p2p_key",
    "save_recorded",
    "load_recorded",
    "record_sha256",
    "TENSOR_DIGESTS",
    "tensors_sha256",
    "write_index",
    "check_files",
    "read_index",
    "write_capture",
    "RecordedStore",
    "record_for_values_ranks",
    "record_p2p_for_values_ranks",
    "derive_from_capture",
    "CAPTURE_SCHEMA",
]

log = logging.getLogger(__name__)

CAPTURE_SCHEMA = 2
"""2: ``rank-R.json`` carries the sha256 of ``rank-R.safetensors`` and of itself."""


def tensors_sha256(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
    """Digest of named tensors (name, dtype, shape, bytes, in name order) and string metadata."""
    h = hashlib.sha256()
    for k in sorted(metadata or {}):
        h.update(f"meta|{k}|{metadata[k]}|".encode())
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().reshape(-1)
        h.update(f"t|{name}|{t.dtype}|{tuple(tensors[name].shape)}|".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())  # the buffer itself: no copy
    return h.hexdigest()


def record_sha256(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """The checksum a record file carries in its metadata. A record with ``tensor_sha256`` (each
    tensor's own digest, in the metadata) is checked by its metadata alone and each tensor against
    its digest, so a reader may read a part of it verified (:func:`load_recorded`'s ``select``); a
    record written before (no ``tensor_sha256``) by its tensors and its other metadata."""
    meta = {k: v for k, v in metadata.items() if k != "sha256"}
    return tensors_sha256({} if TENSOR_DIGESTS in meta else tensors, meta)


TENSOR_DIGESTS = "tensor_sha256"
"""Record metadata: ``{tensor name: tensors_sha256 of that tensor alone}`` (JSON)."""


def _pruned_remedy(directory: Path) -> str:
    return (f"remove {directory} and write it again: `prism emulate`/`prism calibrate` derive it from "
            "RUN/capture, or re-run `prism collect` with values.ranks set to this rank set")


def _capture_remedy(directory: Path) -> str:
    return f"remove {directory} and run `prism calibrate` on the run again (it captures anew)"


def set_key(ranks: Iterable[int]) -> str:
    return "ranks-" + "_".join(str(r) for r in sorted(set(ranks)))


def recorded_dir(run_dir: str | Path, ranks: Iterable[int]) -> Path:
    return Path(run_dir) / "payloads" / "pruned" / set_key(ranks)


def collective_key(group_id: str, seq: int, part: int) -> str:
    return f"c/{group_id}/{seq}/{part}"


def p2p_key(group_id: str, src: int, dst: int, seq: int, part: int) -> str:
    return f"p/{group_id}/{src}-{dst}/{seq}/{part}"


def _path(directory: Path, key: str) -> Path:
    kind, group, *rest = key.split("/")
    name = ".".join(rest) + ".safetensors"
    return directory / kind / quote(group, safe="") / name


# -------------------------------------------------------------------------------- one file


def save_recorded(directory: str | Path, key: str, rec: RecordedCollective) -> Path:
    tensors: dict[str, torch.Tensor] = {}
    shared_out: list[int] = []
    outs = list(rec.outputs.items())
    if len(outs) > 1 and all(t is outs[0][1] for _, t in outs):
        tensors["out"] = outs[0][1]
        shared_out = [g for g, _ in outs]
    else:
        tensors.update({f"out.{g}": t for g, t in outs})
    tensors.update({f"in.{g}": t for g, t in rec.inputs.items()})
    tensors.update({f"entry.{g}": t for g, t in rec.entry_partials.items()})
    tensors.update({f"sub.{g}": t for g, t in rec.subtree_partials.items()})
    tensors.update({f"partner.{g}": t for g, t in rec.partner_inputs.items()})
    meta = {
        "algo": rec.algo.value,
        "group_size": str(rec.group_size),
        "sandbox": json.dumps(list(rec.sandbox)),
        "reduce_op": rec.reduce_op,
        "root": str(rec.root),
        "peer": str(rec.peer),
        "premul": json.dumps({str(k): v for k, v in rec.premul.items()}),
        "in_splits": json.dumps({str(k): list(v) for k, v in rec.in_splits.items()}),
        "out_splits": json.dumps({str(k): list(v) for k, v in rec.out_splits.items()}),
        "row_numel": str(rec.row_numel),
        "shared_out": json.dumps(shared_out),
    }
    tensors = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
    meta[TENSOR_DIGESTS] = json.dumps({k: tensors_sha256({k: v}) for k, v in tensors.items()}, sort_keys=True)
    meta["sha256"] = record_sha256(tensors, meta)
    path = _path(Path(directory), key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_recorded(directory: str | Path, key: str, *, indexed: bool = False,
                  select: Callable[[str], bool] | None = None) -> RecordedCollective | None:
    """The record stored under ``key``, its checksum verified; None when there is none (an error
    when ``indexed``: the set's index lists it). ``select``: read only the tensors whose name it
    accepts (``in.<group rank>``, ``out``, ``entry.<group rank>`` ...), each verified against its
    own digest; a record written without per-tensor digests is read whole."""
    directory = Path(directory)
    path = _path(directory, key)
    try:
        tensors, meta = read_safetensors(path, select)
        if select is not None and TENSOR_DIGESTS not in meta:
            tensors, meta = read_safetensors(path)
            select = None
    except FileNotFoundError:
        if indexed:
            raise IntegrityError(path, f"recorded data of {key} is missing (listed in index.json)",
                                 _pruned_remedy(directory)) from None
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise IntegrityError(path, f"recorded data of {key} is {safetensors_problem(path, e)}",
                             _pruned_remedy(directory)) from e
    want = meta.get("sha256", "")
    got = record_sha256(tensors, meta)
    if got != want:
        problem = (f"sha256 mismatch in the recorded data of {key}: its content hashes to {got}, "
                   f"the file says {want} (the file was modified or corrupted)"
                   if want else f"recorded data of {key} carries no sha256 (written by an older prism, or corrupt)")
        raise IntegrityError(path, problem, _pruned_remedy(directory))
    if TENSOR_DIGESTS in meta:
        _check_tensor_digests(path, key, tensors, json.loads(meta[TENSOR_DIGESTS]), select, directory)

    def by_rank(prefix: str) -> dict[int, torch.Tensor]:
        return {int(k.split(".", 1)[1]): v for k, v in tensors.items() if k.startswith(prefix + ".")}

    outputs = by_rank("out")
    if "out" in tensors:
        for g in json.loads(meta["shared_out"]):
            outputs[g] = tensors["out"]
    return RecordedCollective(
        Algo(meta["algo"]),
        int(meta["group_size"]),
        tuple(json.loads(meta["sandbox"])),
        reduce_op=meta["reduce_op"],
        root=int(meta["root"]),
        peer=int(meta["peer"]),
        inputs=by_rank("in"),
        outputs=outputs,
        premul={int(k): v for k, v in json.loads(meta["premul"]).items()},
        entry_partials=by_rank("entry"),
        subtree_partials=by_rank("sub"),
        partner_inputs=by_rank("partner"),
        in_splits={int(k): tuple(v) for k, v in json.loads(meta["in_splits"]).items()},
        out_splits={int(k): tuple(v) for k, v in json.loads(meta["out_splits"]).items()},
        row_numel=int(meta["row_numel"]),
    )


def _check_tensor_digests(path: Path, key: str, tensors: dict[str, torch.Tensor], digests: dict[str, str],
                          select: Callable[[str], bool] | None, directory: Path) -> None:
    """Each tensor read against its digest, and the names read against the names the (verified)
    metadata lists: all of them, or all that ``select`` accepts."""
    listed = set(digests) if select is None else {name for name in digests if select(name)}
    if set(tensors) != listed:
        raise IntegrityError(path, f"sha256 mismatch in the recorded data of {key}: it holds tensors "
                                   f"{sorted(tensors)} where its metadata lists {sorted(listed)} (the file was "
                                   "modified or corrupted)", _pruned_remedy(directory))
    for name, t in tensors.items():
        got = tensors_sha256({name: t})
        if got != digests[name]:
            raise IntegrityError(path, f"sha256 mismatch in the recorded data of {key}: tensor {name} hashes to "
                                       f"{got}, the file says {digests[name]} (the file was modified or corrupted)",
                                 _pruned_remedy(directory))


def write_index(directory: str | Path) -> dict[str, dict]:
    """Scan the files and write ``index.json`` (key -> file, algo, group size, bytes; plus the
    sha256 of that content)."""
    directory = Path(directory)
    index: dict[str, dict] = {}
    for path in sorted(directory.glob("[cp]/*/*.safetensors")):
        kind, group = path.parent.parent.name, path.parent.name
        stem = path.name[: -len(".safetensors")].split(".")
        key = "/".join([kind, unquote(group), *stem])
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
        index[key] = {"file": str(path.relative_to(directory)), "algo": meta["algo"],
                      "group_size": int(meta["group_size"]), "bytes": path.stat().st_size}
    atomic_write_text(directory / "index.json", dumps_checked(index, indent=0))
    return index


def read_index(directory: str | Path) -> dict[str, dict]:
    """``index.json`` of a recorded set (key -> file, algo, group size, bytes), its checksum
    verified; an IntegrityError when it is missing (the run that wrote the set did not finish)."""
    directory = Path(directory)
    return load_checked(directory / "index.json", what="the index of the recorded data",
                        remedy=_pruned_remedy(directory))


def check_files(directory: str | Path) -> int:
    """Every file ``index.json`` lists is there with its size (a stat each; contents are verified
    when read). Run before any process starts, so a missing or cut file stops a command at once.
    Returns the number of files."""
    directory = Path(directory)
    index = read_index(directory)
    for key, entry in index.items():
        path = directory / entry["file"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(path, f"recorded data of {key} is missing (listed in index.json)",
                                 _pruned_remedy(directory)) from None
        if size != entry["bytes"]:
            raise IntegrityError(path, f"recorded data of {key} is truncated or replaced ({size} of "
                                 f"{entry['bytes']} bytes)", _pruned_remedy(directory))
    return len(index)


class RecordedStore:
    """Read side with a prefetch pool. Both sides load ahead of time: the replayer every record of
    the ops it serves, the ``live`` engine those of each channel it uses (its sends and
    collectives), up to ``preload_bytes`` in all (sizes from ``index.json``), then a few ops ahead.
    Loading is Python work that shares the GIL with the threads that run the ops; done ahead it
    stays off their critical path."""

    def __init__(self, directory: str | Path, *, prefetch_workers: int = 2,
                 preload_bytes: int = 256 * 1024 * 1024,
                 select: Callable[[str, dict], Callable[[str], bool] | None] | None = None) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise RunDirError(f"{self.directory}: no recorded data for this sandbox set (collect the job with "
                              "values.ranks set to it, or derive it from a capture run)")
        self._index: dict[str, dict] = read_index(self.directory)
        self._pool = ThreadPoolExecutor(max_workers=prefetch_workers, thread_name_prefix="prism-prefetch")
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._preload_left = preload_bytes
        self._select = select
        """``select(key, index entry)``: which tensors of the record to read (:func:`load_recorded`'s
        ``select``; None: all)."""

    def index(self) -> dict[str, dict]:
        """``index.json`` (key -> file, algo, group size, bytes), checked (:func:`read_index`)."""
        return self._index

    def _load(self, key: str) -> RecordedCollective | None:
        entry = self.index().get(key)
        select = self._select(key, entry or {}) if self._select is not None else None
        return load_recorded(self.directory, key, indexed=entry is not None, select=select)

    def keys_under(self, prefix: str) -> list[str]:
        """Indexed keys that start with ``prefix`` (e.g. a channel's ``c/<group>/``), in (seq, part) order."""
        keys = [k for k in self.index() if k.startswith(prefix)]
        return sorted(keys, key=lambda k: tuple(int(x) for x in k[len(prefix):].split("/")))

    def preload(self, keys: Iterable[str]) -> int:
        """Load ``keys`` in the background, in order, while the budget lasts; returns how many are
        loading or loaded (queued now or before)."""
        index = self.index()
        num = 0
        with self._lock:
            for key in keys:
                size = index.get(key, {}).get("bytes", 0)
                if key in self._pending:
                    num += 1
                    continue
                if size > self._preload_left:
                    break
                self._preload_left -= size
                self._pending[key] = self._pool.submit(self._load, key)
                num += 1
        return num

    def wait_loaded(self, timeout_s: float | None = None) -> int:
        """Block until every load queued so far and not yet taken has ended (read, or failed: ``get``
        raises its error), or ``timeout_s`` passed; returns how many loads it waited for."""
        with self._lock:
            pending = list(self._pending.values())
        futures_wait(pending, timeout=timeout_s)
        return len(pending)

    def prefetch(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                if key not in self._pending:
                    self._pending[key] = self._pool.submit(self._load, key)

    def loaded(self, key: str) -> bool:
        """Whether ``key``'s record is in memory (preloaded or prefetched, its load done): ``get``
        returns at once."""
        with self._lock:
            fut = self._pending.get(key)
        return fut is not None and fut.done()

    def get(self, key: str) -> RecordedCollective | None:
        with self._lock:
            fut = self._pending.pop(key, None)
        return fut.result() if fut is not None else self._load(key)

    def num_parts(self, key_of_part) -> int:
        """How many parts an op has: ``key_of_part(i)`` for i = 0, 1, ... until one is not indexed."""
        index = self.index()
        i = 0
        while key_of_part(i) in index:
            i += 1
        return i

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------- the writers


def record_for_values_ranks(
    run_dir: str | Path,
    group_id: str,
    seq: int,
    op: str | CommOp,
    reduce_op: str,
    group_ranks: Sequence[int],
    inputs_by_group_rank: Sequence[Sequence[torch.Tensor]],
    values_ranks: Iterable[int],
    *,
    root: int = -1,
    flat: bool = False,
    in_splits_by_group_rank: Sequence[Sequence[int]] | None = None,
    tree_all_reduce: bool = False,
    directory: str | Path | None = None,
) -> list[str]:
    """Store what sandbox set ``values_ranks`` needs to run collective ``(group_id, seq)`` pruned.
    ``tree_all_reduce``: all-reduces run as the tree (:mod:`.algorithms`); the record says which
    algorithm, and the ``live`` engine follows it.

    ``inputs_by_group_rank[g]``: the tensors group rank g handed in (the collector's
    ``Arrival.inputs``); ``root`` a global rank (-1 when none); ``flat`` the request's flat flag;
    splits from each rank's header; ``directory``: where to write (default: the set's directory
    under ``run_dir``). Returns the keys written (none when no values rank is in the
    group, or for a barrier, whose record is synthesized)."""
    values = set(values_ranks)
    op = CommOp(op) if isinstance(op, str) else op
    sandbox = [g for g, r in enumerate(group_ranks) if r in values]
    if not sandbox or op is CommOp.BARRIER:
        return []
    n = len(group_ranks)
    if len(inputs_by_group_rank) != n:
        raise PrismError(f"{op.value} {group_id}:{seq}: {len(inputs_by_group_rank)} inputs for a group of {n}")
    root_g = list(group_ranks).index(root) if root >= 0 else 0
    what = f"{op.value} {group_id}:{seq}"
    splits = in_splits_by_group_rank or [()] * n
    parts = [op_parts(op, inputs_by_group_rank[g], n=n, group_rank=g, root=root_g, flat=flat,
                      in_splits=splits[g], what=what) for g in range(n)]
    num_parts = {len(p) for p in parts}
    if len(num_parts) != 1:
        raise PrismError(f"{what}: ranks hand in different numbers of tensors ({sorted(num_parts)})")
    directory = recorded_dir(run_dir, values) if directory is None else Path(directory)
    keys = []
    for i in range(num_parts.pop()):
        mine = [p[i] for p in parts]
        algo = mine[0].algo
        if tree_all_reduce and op is CommOp.ALL_REDUCE:
            algo = Algo.TREE_ALL_REDUCE
        rec = record_for_sandbox(
            [m.data for m in mine], algo, reduce_op if algo.reduces else "", sandbox, root=mine[0].root,
            in_splits=[m.in_splits for m in mine] if algo is Algo.DIRECT_ALL_TO_ALL else None,
        )
        if algo is Algo.CHAIN_BROADCAST:  # non-roots hand in a buffer, not a contribution
            rec = _only_root_input(rec)
        key = collective_key(group_id, seq, i)
        save_recorded(directory, key, rec)
        keys.append(key)
    return keys


def _only_root_input(rec: RecordedCollective) -> RecordedCollective:
    return dataclasses.replace(rec, inputs={g: t for g, t in rec.inputs.items() if g == rec.root})


def record_p2p_for_values_ranks(
    run_dir: str | Path,
    group_id: str,
    group_ranks: Sequence[int],
    src: int,
    dst: int,
    seq: int,
    tensors: Sequence[torch.Tensor],
    values_ranks: Iterable[int],
    *,
    directory: str | Path | None = None,
) -> list[str]:
    """Store message ``(src, dst, group_id, seq)`` (global ranks, per-pair sequence) for the
    values ranks among src and dst: the message a vrank sender must deliver, or the one a vrank
    receiver checks the sandbox sender's against."""
    values = set(values_ranks)
    if src not in values and dst not in values:
        return []
    ranks = list(group_ranks)
    n, s, d = len(ranks), ranks.index(src), ranks.index(dst)
    sandbox = [g for g in (s, d) if ranks[g] in values]
    directory = recorded_dir(run_dir, values) if directory is None else Path(directory)
    keys = []
    for i, t in enumerate(tensors):
        inputs = [t.detach().reshape(-1) if g == s else torch.empty(0, dtype=t.dtype) for g in range(n)]
        rec = record_for_sandbox(inputs, Algo.P2P, "", sandbox, root=s, peer=d)
        key = p2p_key(group_id, src, dst, seq, i)
        save_recorded(directory, key, rec)
        keys.append(key)
    return keys


# ------------------------------------------------------------------------- from a capture


def _capture_path(directory: Path, rank: int, suffix: str) -> Path:
    return directory / f"rank-{rank:05d}{suffix}"


def write_capture(directory: str | Path, rank: int, tensors: dict[str, torch.Tensor], ops: list[dict]) -> None:
    """Write one rank's capture: ``rank-R.safetensors`` (tensors ``<key>/in|out/<i>``) and
    ``rank-R.json`` (op list, and the sha256 and size of the tensors file), each atomically; the
    JSON last, so a capture whose JSON exists is whole."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = _capture_path(directory, rank, ".safetensors")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp))
        h = hashlib.sha256()
        with tmp.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
            os.fsync(f.fileno())
        size = tmp.stat().st_size
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    body = {"schema": CAPTURE_SCHEMA, "rank": rank, "ops": ops, "tensors_file": path.name,
            "tensors_sha256": h.hexdigest(), "tensors_bytes": size}
    atomic_write_text(_capture_path(directory, rank, ".json"), dumps_checked(body))


class _Capture:
    """A capture run's files: per rank ``rank-R.json`` (op list) and ``rank-R.safetensors``, each
    checked against its sha256 when first read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._meta: dict[int, dict[str, dict]] = {}
        self._files: dict[int, dict] = {}
        self._tensors: dict[int, dict[str, torch.Tensor]] = {}

    def meta(self, rank: int) -> dict[str, dict]:
        if rank not in self._meta:
            path = _capture_path(self.directory, rank, ".json")
            remedy = _capture_remedy(self.directory)
            data = load_checked(path, what=f"the capture of rank {rank}", remedy=remedy)
            if data.get("schema") != CAPTURE_SCHEMA:
                raise RunDirError(f"{path}: capture schema {data.get('schema')} (expected {CAPTURE_SCHEMA}); {remedy}")
            self._files[rank] = data
            self._meta[rank] = {op["key"]: op for op in data["ops"]}
        return self._meta[rank]

    def _load_tensors(self, rank: int) -> dict[str, torch.Tensor]:
        self.meta(rank)
        info = self._files[rank]
        path = self.directory / info["tensors_file"]
        remedy = _capture_remedy(self.directory)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                got = hashlib.file_digest(f, "sha256").hexdigest()  # streamed: no copy of the file
        except FileNotFoundError:
            raise IntegrityError(path, f"the captured tensors of rank {rank} are missing", remedy) from None
        json_name = _capture_path(self.directory, rank, ".json").name
        if size != info["tensors_bytes"]:
            how = "truncated" if size < info["tensors_bytes"] else "corrupt"
            raise IntegrityError(path, f"the captured tensors of rank {rank} are {how} ({size} bytes, "
                                 f"{json_name} says {info['tensors_bytes']})", remedy)
        if got != info["tensors_sha256"]:
            raise IntegrityError(path, f"sha256 mismatch in the captured tensors of rank {rank}: the file hashes to "
                                 f"{got}, {json_name} says {info['tensors_sha256']} (the file was modified or "
                                 "corrupted)", remedy)
        return load_file(str(path))

    def inputs(self, rank: int, key: str) -> list[torch.Tensor]:
        if rank not in self._tensors:
            self._tensors[rank] = self._load_tensors(rank)
        op = self.meta(rank)[key]
        return [self._tensors[rank][f"{key}/in/{i}"] for i in range(op["num_inputs"])]


def derive_from_capture(run_dir: str | Path, capture_dir: str | Path, ranks: Iterable[int], *,
                        tree_all_reduce: bool = False) -> Path:
    """Compute the recorded data of sandbox set ``ranks`` from a capture run (every rank's inputs
    of every op), exactly as the collector would: same function, same inputs. The directory is
    built beside its place and renamed: it appears whole or not at all."""
    ranks = sorted(set(ranks))
    target = recorded_dir(run_dir, ranks)
    building = target.with_name(f".{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        num = _derive(run_dir, _Capture(Path(capture_dir)), ranks, building, tree_all_reduce)
        building.mkdir(parents=True, exist_ok=True)
        write_index(building)
        shutil.rmtree(target, ignore_errors=True)  # an unfinished one (no index) is replaced
        building.replace(target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    log.info("derived %d pruned records for ranks %s into %s", num, ranks, target)
    return target


def _derive(run_dir: str | Path, cap: _Capture, ranks: list[int], directory: Path, tree_all_reduce: bool) -> int:
    done: set[str] = set()
    num = 0
    for r in ranks:
        for key, op in cap.meta(r).items():
            if key in done:
                continue
            done.add(key)
            members = op["group_ranks"]
            if key.startswith("c/"):
                for m in members:
                    if key not in cap.meta(m):
                        raise RunDirError(f"capture: rank {m} has no {op['op']} {key} (rank {r} has)")
                num += len(record_for_values_ranks(
                    run_dir, op["group_id"], op["seq"], op["op"], op["reduce_op"], members,
                    [cap.inputs(m, key) for m in members], ranks, root=op["root"], flat=op["flat"],
                    in_splits_by_group_rank=[cap.meta(m)[key]["in_splits"] for m in members],
                    tree_all_reduce=tree_all_reduce, directory=directory,
                ))
            else:
                src, dst = op["src"], op["dst"]
                num += len(record_p2p_for_values_ranks(
                    run_dir, op["group_id"], members, src, dst, op["seq"], cap.inputs(src, key), ranks,
                    directory=directory,
                ))
    return num
