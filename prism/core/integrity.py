"""Integrity of the files prism reads back: a checksum is written with the data, checked on read.

* Checked JSON (:func:`dumps_checked`, :func:`load_checked`): a JSON object that carries, under
  ``"sha256"``, the digest of its other fields in canonical form (sorted keys, no spaces).
* safetensors files: the library rejects a file whose size disagrees with its header; when it
  does, :func:`safetensors_problem` says whether the file is truncated or corrupt, from the
  file's own header (the 8-byte header length, the JSON header, the data offsets).
* :class:`VerifiedFiles`: the files this process has verified already, so that a file read many
  times (a payload every rank of an all-reduce receives) is hashed once, when first read.

Every failure is an :class:`~prism.core.errors.IntegrityError` naming the file, what is wrong
(missing, truncated, sha256 mismatch, corrupt) and the command that writes the file again.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path

from .errors import IntegrityError

__all__ = ["dumps_checked", "load_checked", "json_sha256", "safetensors_problem", "VerifiedFiles"]

_SHA_KEY = "sha256"


def json_sha256(body: dict) -> str:
    """sha256 of ``body`` in canonical JSON form (sorted keys, no spaces)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dumps_checked(body: dict, *, indent: int | None = None) -> str:
    """``body`` as JSON, plus ``"sha256"``: :func:`json_sha256` of ``body``."""
    assert _SHA_KEY not in body, "the checksum key is reserved"
    return json.dumps({**body, _SHA_KEY: json_sha256(body)}, indent=indent, sort_keys=True)


def load_checked(path: str | os.PathLike[str], *, what: str, remedy: str) -> dict:
    """The object written by :func:`dumps_checked` at ``path``, without its ``"sha256"``.

    ``what`` names the file in the message ("the capture of rank 3"); ``remedy`` says how to
    write it again. Raises IntegrityError when the file is missing, truncated, not JSON, or its
    checksum does not match."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, f"{what} is missing", remedy) from None
    except OSError as e:
        raise IntegrityError(path, f"cannot read {what}: {e}", remedy) from e
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except UnicodeDecodeError as e:
        raise IntegrityError(path, f"{what} is corrupt (not UTF-8 at byte {e.start})", remedy) from e
    except json.JSONDecodeError as e:
        if not text.rstrip().endswith("}"):  # what dumps_checked writes always ends the object
            raise IntegrityError(path, f"{what} is truncated ({len(raw)} bytes, the JSON ends early)", remedy) from e
        raise IntegrityError(path, f"{what} is corrupt (not JSON: {e.msg} at byte {e.pos})", remedy) from e
    if not isinstance(obj, dict) or not isinstance(obj.get(_SHA_KEY), str):
        raise IntegrityError(path, f"{what} carries no sha256 (written by an older prism, or corrupt)", remedy)
    want = obj.pop(_SHA_KEY)
    got = json_sha256(obj)
    if got != want:
        raise IntegrityError(path, f"sha256 mismatch in {what}: its content hashes to {got}, "
                             f"the file says {want} (the file was modified or corrupted)", remedy)
    return obj


def safetensors_problem(path: str | os.PathLike[str], error: BaseException) -> str:
    """What is wrong with a safetensors file the library refused (``error``): "missing",
    "truncated (N of M bytes)", or "corrupt (...)"."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"truncated ({size} bytes, not even a header)"
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                return f"truncated ({size} of at least {8 + n} bytes: the header is cut)"
            header = json.loads(f.read(n).decode("utf-8"))
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, struct.error) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return f"corrupt (unreadable header: {e})"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return f"corrupt (the header does not describe its tensors: {error})"
    want = 8 + n + end
    if size < want:
        return f"truncated ({size} of {want} bytes)"
    if size > want:
        return f"corrupt ({size - want} bytes more than its header describes)"
    return f"corrupt ({error})"


class VerifiedFiles:
    """Files this process has verified, by path, size and modification time: a file is hashed
    when first read, and again only if it was replaced since."""

    def __init__(self) -> None:
        self._done: set[tuple[str, int, int]] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _id(path: Path) -> tuple[str, int, int]:
        st = path.stat()
        return (str(path), st.st_size, st.st_mtime_ns)

    def done(self, path: Path) -> bool:
        try:
            key = self._id(path)
        except OSError:
            return False
        with self._lock:
            return key in self._done

    def add(self, path: Path) -> None:
        key = self._id(path)
        with self._lock:
            self._done.add(key)
