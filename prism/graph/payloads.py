"""Recorded comm payloads: RUN/payloads/<sha256>.safetensors, content-addressed, plus an index.

Written by collect's coordinator (RUN/payloads/) and by ``prism record --payloads``
(RUN/payloads_real/rank-R/, the same format per rank); read by collect, emulate's derivations and
``prism replay --values``. It lives in the graph layer so that the sandbox can read and write it.

A payload is the list of tensors one rank received from one comm op (its outputs), or, for the
ranks named in ``values.ranks``, what it handed in (its inputs, for later compensation). Equal
contents are stored once (every rank of an all-reduce receives the same bytes). The index
``RUN/payloads/index.json`` maps ``"<rank>/<group_id>/<seq>/<kind>"`` to
``{"outputs": hash, "inputs": hash}``; the output hash is also the graph node's ``payload``.

Integrity: a payload's name is :func:`payload_hash` of its tensors, and :func:`load_payload`
checks it the first time this process reads the file (:class:`~prism.core.integrity.VerifiedFiles`:
a payload every rank of an all-reduce receives is hashed once); the index carries a sha256 of
its content (:func:`~prism.core.integrity.dumps_checked`), checked by :func:`load_index`. A
missing, truncated or altered file is an :class:`~prism.core.errors.IntegrityError` naming it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from prism.core.atomic import atomic_write_text
from prism.core.config import ValuesPolicy
from prism.core.errors import IntegrityError, RunDirError
from prism.core.integrity import VerifiedFiles, dumps_checked, load_checked, safetensors_problem
from prism.core.ranks import parse_rank_ranges
from prism.core.tensorfile import read_safetensors

__all__ = ["PayloadPolicy", "PayloadStore", "payload_hash", "load_payload", "load_index", "op_key", "write_error"]

_VERIFIED = VerifiedFiles()


def _remedy(directory: Path) -> str:
    return f"re-run `prism collect` to write {directory} again"


def op_key(rank: int, group_id: str, seq: int, kind: str) -> str:
    """``kind``: the graph node kind (COLLECTIVE, SEND, RECV)."""
    return f"{rank}/{group_id}/{seq}/{kind}"


def payload_hash(tensors: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().contiguous().reshape(-1)
        h.update(f"{c.dtype}|{tuple(t.shape)}|".encode())
        if c.numel():
            h.update(c.view(torch.uint8).numpy())  # the buffer itself: no copy
    return h.hexdigest()


def load_payload(directory: str | Path, digest: str) -> list[torch.Tensor]:
    """The tensors of payload ``digest``; the first read in this process checks their hash."""
    directory = Path(directory)
    path = directory / f"{digest}.safetensors"
    verified = _VERIFIED.done(path)
    try:
        data, _ = read_safetensors(path)  # not mapped: a replayed rank reads payloads while its script runs
    except FileNotFoundError:
        raise IntegrityError(path, "payload is missing", _remedy(directory)) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise IntegrityError(path, f"payload is {safetensors_problem(path, e)}", _remedy(directory)) from e
    try:
        tensors = [data[str(i)] for i in range(len(data))]
    except KeyError:
        raise IntegrityError(path, f"payload is corrupt (tensor names {sorted(data)})", _remedy(directory)) from None
    if not verified:
        got = payload_hash(tensors)
        if got != digest:
            raise IntegrityError(path, f"sha256 mismatch: its tensors hash to {got}, its name says "
                                 f"{digest} (the file was modified or corrupted)", _remedy(directory))
        _VERIFIED.add(path)
    return tensors


def load_index(directory: str | Path) -> dict[str, dict[str, str]]:
    """``RUN/payloads/index.json`` (op key -> {"outputs": hash, "inputs": hash}), checked."""
    directory = Path(directory)
    return load_checked(directory / "index.json", what="the payload index", remedy=_remedy(directory))


@dataclass(frozen=True, slots=True)
class PayloadPolicy:
    enabled: bool
    small_max_bytes: int
    full_ranks: frozenset[int]

    @staticmethod
    def from_config(values: ValuesPolicy, world_size: int) -> PayloadPolicy:
        ranks = parse_rank_ranges(values.ranks, world_size) if values.ranks else ()
        return PayloadPolicy(values.record != "none", values.small_max_bytes, frozenset(ranks))

    def keep_outputs(self, rank: int, size_bytes: int) -> bool:
        return self.enabled and (size_bytes <= self.small_max_bytes or rank in self.full_ranks)

    def keep_inputs(self, rank: int) -> bool:
        return self.enabled and rank in self.full_ranks


class PayloadStore:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self.index: dict[str, dict[str, str]] = {}
        self.num_bytes_written = 0

    def put(self, tensors: Sequence[torch.Tensor]) -> str:
        digest = payload_hash(tensors)
        with self._lock:
            if digest in self._known:
                return digest
            self._known.add(digest)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{digest}.safetensors"
        tmp = path.with_suffix(".tmp")
        try:
            save_file({str(i): t.detach().contiguous().clone() for i, t in enumerate(tensors)}, str(tmp))
            tmp.replace(path)
        except (OSError, SafetensorError) as e:
            raise write_error(path, e) from e
        with self._lock:
            self.num_bytes_written += path.stat().st_size
        return digest

    def note(self, key: str, what: str, digest: str) -> None:
        with self._lock:
            self.index.setdefault(key, {})[what] = digest

    def write_index(self) -> None:
        if self.index:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / "index.json"
            try:
                atomic_write_text(path, dumps_checked(self.index, indent=0))
            except OSError as e:
                raise write_error(path, e) from e


def write_error(path: Path, error: Exception) -> RunDirError:
    """A failed write of recorded data as the error that stops the run: the file and the cause."""
    cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return RunDirError(f"{path}: cannot write recorded data: {cause}; the collection was stopped "
                       f"(free space on that file system, or collect into another directory)")
