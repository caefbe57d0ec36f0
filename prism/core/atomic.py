"""Atomic writes: build beside the target, fsync, rename.

Temporaries are named ``.<target name>.<pid>.<random>.tmp`` in the target's directory (a rename
never crosses file systems). A writer killed with SIGKILL cannot remove its temporary; the next
writer of that directory does (:func:`remove_stale_temporaries`: the pid in the name is gone).
Readers never look at dot-names, so a stale temporary is never mistaken for data.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_directory",
    "make_temp_dir",
    "install_directory",
    "remove_stale_temporaries",
]


def _prefix(name: str) -> str:
    return f".{name}.{os.getpid()}."


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_prefix(target.name), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def make_temp_dir(parent: str | os.PathLike[str], name: str) -> Path:
    """A new temporary directory in ``parent`` named for ``name`` and this process."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=_prefix(name), suffix=".tmp", dir=parent))


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def install_directory(src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make the finished directory ``src`` the directory ``target``, replacing any old one as a
    whole: at every instant ``target`` is the old directory or the new one (an atomic exchange
    where the kernel has one; elsewhere the old one is moved aside first)."""
    src, target = Path(src), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.replace(src, target)
        return
    if _exchange(src, target):  # src now holds the old directory
        shutil.rmtree(src, ignore_errors=True)
        return
    old = make_temp_dir(target.parent, target.name)
    os.replace(target, old / "old")
    os.replace(src, target)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds.

    An existing directory at ``path`` is replaced as a whole; on error the
    temporary directory is removed and ``path`` is left as it was.
    """
    target = Path(path)
    remove_stale_temporaries(target.parent)
    tmp = make_temp_dir(target.parent, target.name)
    try:
        yield tmp
        install_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries in ``directory`` whose writer is gone; return what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.glob(".*.tmp"):
        fields = path.name[: -len(".tmp")].rsplit(".", 2)
        if len(fields) != 3 or not fields[1].isdigit() or _pid_alive(int(fields[1])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed
