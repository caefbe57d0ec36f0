"""Every run of the user's script starts from the same world (docs/isolation.md).

Real training scripts write beside themselves — checkpoints, snapshots, logs — and read them back
the next time they start (resume from the latest checkpoint). Run after run of the same script
(record, collect, the capture run, each calibration slice, each emulation) would each take another
path. So:

* The script's folder is snapshot once per run directory, into ``RUN/source/`` (taken anew by a
  command that starts from the job file when the folder changed since). Entries named in
  ``isolation.share`` (and ``.git``, ``.venv``, ...) and files over ``isolation.max_copy_bytes``
  are symbolic links to the originals; caches (``__pycache__``) and prism run directories are left
  out.
* Each run gets a fresh copy of the snapshot under ``RUN/work/`` and runs there (its ranks share it,
  as ranks under torchrun share their working directory). When it ends, the files it created or
  changed move to ``RUN/outputs/<phase>/`` and the copy is removed.
* The script's own folder is compared before and after the run: what changed there was written
  outside the working directory (an absolute path, or through a shared link) and is reported with
  a warning, and in ``RUN/outputs/<phase>.json``.
* ``isolation.extra`` names paths outside the folder that the script writes: each run finds them
  as they were at the snapshot, what it wrote moves to ``RUN/outputs/<phase>/extra/``, and they are
  put back as they were.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .atomic import atomic_write_text, make_temp_dir, remove_stale_temporaries
from .config import JobConfig
from .errors import ConfigError

__all__ = ["Workspace", "isolated_run", "source_root", "snapshot_source", "outside_writes", "SOURCE_DIR", "OUTPUTS_DIR",
           "WORK_DIR"]

log = logging.getLogger(__name__)

SOURCE_DIR = "source"
OUTPUTS_DIR = "outputs"
WORK_DIR = "work"
_SNAPSHOT_FILE = "source.json"
_EXTRA_DIR = "source-extra"
_ALWAYS_SKIPPED = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints")
_ALWAYS_SHARED = (".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox")
_MAX_FILES = 50_000
"""More files than this in the script's folder is not a script's folder (a home directory, a data set):
the user names the big entries in ``isolation.share``."""

Manifest = dict[str, tuple[int, int]]
"""Relative path -> (size, mtime_ns) of the regular files (and links) of a tree."""


@dataclass(slots=True)
class Workspace:
    """Where one run of the script runs, and what it wrote (filled in when the run ends)."""

    cwd: str
    entrypoint: str
    """The script in the working copy (absolute), or ``-m module``."""
    phase: str = ""
    outputs: Path | None = None
    written: list[str] = field(default_factory=list)
    """Files the run created or changed in its working directory (now under ``outputs``)."""
    outside: list[str] = field(default_factory=list)
    """``path (added|changed|removed)`` for each change in the script's own folder during the run."""


def source_root(job: JobConfig) -> Path:
    """The folder a run's working directory is a copy of: the script's, or the job file's for ``-m``."""
    return Path(job.base_dir).resolve() if job.is_module else job.script_path.parent


def _is_run_dir(path: Path) -> bool:
    return (path / "job.yaml").is_file() and any((path / d).is_dir() for d in ("graph", SOURCE_DIR, "capture"))


def _shared(rel: str, name: str, patterns: tuple[str, ...]) -> bool:
    return name in _ALWAYS_SHARED or any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _plan(root: Path, job: JobConfig, run_root: Path) -> tuple[list[str], list[str], list[str]]:
    """(directories, files to copy, entries to link), relative to ``root``."""
    dirs, files, links = [], [], []
    patterns = job.isolation.share
    for top, dirnames, filenames in os.walk(root):
        here = Path(top)
        rel_top = here.relative_to(root)
        keep = []
        for d in sorted(dirnames):
            full = here / d
            rel = str(rel_top / d)
            if d in _ALWAYS_SKIPPED or full == run_root or _is_run_dir(full):
                continue
            if full.is_symlink() or _shared(rel, d, patterns):
                links.append(rel)
                continue
            dirs.append(rel)
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            full = here / f
            rel = str(rel_top / f)
            try:
                st = full.lstat()
            except FileNotFoundError:
                continue
            if (full.is_symlink() or _shared(rel, f, patterns)
                    or (job.isolation.max_copy_bytes and st.st_size > job.isolation.max_copy_bytes)):
                links.append(rel)
            else:
                files.append(rel)
        if len(files) + len(links) > _MAX_FILES:
            raise ConfigError("isolation.share", f"{root} holds more than {_MAX_FILES} files; name its large "
                              "folders in isolation.share (linked, not copied) or set isolation.mode: off")
    return dirs, files, links


def _manifest(root: Path, job: JobConfig, run_root: Path) -> Manifest:
    """What the copy of ``root`` would hold, with sizes and times: shared entries by their own entry
    (a shared folder's time changes when an entry is added to it)."""
    _dirs, files, links = _plan(root, job, run_root)
    out: Manifest = {}
    for rel in files + links:
        try:
            st = (root / rel).stat()
        except FileNotFoundError:  # a dangling link
            st = (root / rel).lstat()
        out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def _tree_manifest(root: Path) -> Manifest:
    """Every file and link of a working copy as it is (links are not followed)."""
    out: Manifest = {}
    for top, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _ALWAYS_SKIPPED]
        for f in filenames + [d for d in dirnames if (Path(top) / d).is_symlink()]:
            full = Path(top) / f
            st = full.lstat()
            out[str(full.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _extra_paths(job: JobConfig) -> list[Path]:
    return [(Path(job.base_dir) / p).resolve() for p in job.isolation.extra]


def snapshot_source(job: JobConfig, run_root: Path, *, refresh: bool) -> Path:
    """``RUN/source/``: taken when missing, or (``refresh``) when the script's folder changed since."""
    run_root = Path(run_root).resolve()
    snap = run_root / SOURCE_DIR
    meta_path = run_root / _SNAPSHOT_FILE
    origin = source_root(job)
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and snap.is_dir() else None
    if meta is not None and not refresh:
        return snap
    current = _manifest(origin, job, run_root)
    if meta is not None and meta["origin"] == str(origin) and meta["files"] == {k: list(v) for k, v in current.items()}:
        return snap
    if meta is not None:
        log.info("the script's folder %s changed since %s was taken: taking it again", origin, snap)
    dirs, files, links = _plan(origin, job, run_root)
    tmp = make_temp_dir(run_root, SOURCE_DIR)
    try:
        for rel in dirs:
            (tmp / rel).mkdir(parents=True, exist_ok=True)
        for rel in files:
            shutil.copy2(origin / rel, tmp / rel, follow_symlinks=False)
        for rel in links:
            target = origin / rel
            os.symlink(os.readlink(target) if target.is_symlink() else target, tmp / rel)
        extra = run_root / _EXTRA_DIR
        shutil.rmtree(extra, ignore_errors=True)
        for i, path in enumerate(_extra_paths(job)):
            if path.exists():
                dest = extra / str(i) / path.name
                dest.parent.mkdir(parents=True)
                if path.is_dir():
                    shutil.copytree(path, dest, symlinks=True)
                else:
                    shutil.copy2(path, dest)
        shutil.rmtree(snap, ignore_errors=True)
        os.replace(tmp, snap)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(meta_path, json.dumps({"origin": str(origin), "files": current}, indent=0))
    log.info("snapshot of %s: %d files copied, %d entries linked", origin, len(files), len(links))
    return snap


def _diff(before: Manifest, after: Manifest) -> list[tuple[str, str]]:
    out = [(p, "added" if p not in before else "changed") for p, v in after.items() if before.get(p) != v]
    out += [(p, "removed") for p in before if p not in after]
    return sorted(out)


def _move_into(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    shutil.move(str(src), str(dest))


def _harvest(root: Path, before: Manifest, outputs: Path) -> list[str]:
    """Move what the run created or changed under ``root`` into ``outputs``; return those paths."""
    written = []
    for rel, how in _diff(before, _tree_manifest(root)):
        if how != "removed":
            _move_into(root / rel, outputs / rel)
            written.append(rel)
    return written


@contextlib.contextmanager
def _extras_reset(job: JobConfig, run_root: Path, work: Path, outputs: Path, ws: Workspace) -> Iterator[None]:
    """Put each ``isolation.extra`` path in its snapshot state for the run and back afterwards."""
    saved: list[tuple[Path, Path | None]] = []
    try:
        for i, path in enumerate(_extra_paths(job)):
            keep = work / f".extra-saved-{i}"
            if path.exists() or path.is_symlink():
                shutil.move(str(path), str(keep))
                saved.append((path, keep))
            else:
                saved.append((path, None))
            snap = run_root / _EXTRA_DIR / str(i) / path.name
            if snap.is_dir():
                shutil.copytree(snap, path, symlinks=True)
            elif snap.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(snap, path)
        yield
    finally:
        for i, (path, keep) in enumerate(saved):
            snap = run_root / _EXTRA_DIR / str(i) / path.name
            if path.exists() or path.is_symlink():
                if path.is_dir():
                    base = _tree_manifest(snap) if snap.is_dir() else {}
                    got = _harvest(path, base, outputs / "extra" / f"{i}-{path.name}")
                    shutil.rmtree(path)
                else:
                    changed = not snap.exists() or (snap.stat().st_size, snap.stat().st_mtime_ns) != (
                        path.stat().st_size, path.stat().st_mtime_ns)
                    got = [""] if changed else []
                    if changed:
                        _move_into(path, outputs / "extra" / f"{i}-{path.name}")
                    else:
                        path.unlink()
                ws.written += [f"extra/{i}-{path.name}/{g}".rstrip("/") for g in got]
            if keep is not None:
                shutil.move(str(keep), str(path))


def _slug(phase: str) -> str:
    return phase.replace("/", "-")


@contextlib.contextmanager
def isolated_run(job: JobConfig, run_root: str | os.PathLike[str], phase: str, *,
                 refresh: bool = False) -> Iterator[Workspace]:
    """The working directory of one run of the script (module docstring). ``phase`` names it:
    ``record``, ``collect``, ``capture``, ``calibrate/slice-000``, ``emulate/<id>``. ``refresh``:
    take the snapshot anew if the script's folder changed (commands that start from the job file)."""
    run_root = Path(run_root).resolve()
    origin = source_root(job)
    if job.isolation.mode == "off":
        yield Workspace(cwd=str(origin), entrypoint=job.entrypoint if job.is_module else str(job.script_path),
                        phase=phase)
        return
    run_root.mkdir(parents=True, exist_ok=True)
    snap = snapshot_source(job, run_root, refresh=refresh)
    work_parent = run_root / WORK_DIR
    work_parent.mkdir(exist_ok=True)
    remove_stale_temporaries(work_parent)  # of a command that was killed
    work = make_temp_dir(work_parent, _slug(phase))
    cwd = work / "cwd"
    shutil.copytree(snap, cwd, symlinks=True)
    outputs = run_root / OUTPUTS_DIR / phase
    shutil.rmtree(outputs, ignore_errors=True)
    entry = job.entrypoint if job.is_module else str(cwd / job.script_path.relative_to(origin))
    ws = Workspace(cwd=str(cwd), entrypoint=entry, phase=phase, outputs=outputs)
    before_cwd = _tree_manifest(cwd)
    before_origin = _manifest(origin, job, run_root)
    try:
        with _extras_reset(job, run_root, work, outputs, ws):
            yield ws
    finally:
        try:
            ws.written[:0] = _harvest(cwd, before_cwd, outputs)
            ws.outside = [f"{origin / p} ({how})" for p, how in _diff(before_origin, _manifest(origin, job, run_root))]
            outputs.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(outputs.parent / f"{outputs.name}.json", json.dumps(
                {"phase": phase, "working_directory": str(cwd), "written": ws.written, "outside": ws.outside},
                indent=1))
            if ws.outside:
                log.warning("%s: the script wrote outside its working directory (the script's folder %s changed): "
                            "%s%s", phase, origin, ", ".join(ws.outside[:5]),
                            f" and {len(ws.outside) - 5} more" if len(ws.outside) > 5 else "")
        finally:
            shutil.rmtree(work, ignore_errors=True)


def outside_writes(run_root: str | os.PathLike[str]) -> list[str]:
    """``<phase>: <path> (added|changed|removed)`` for every write outside the working directory that
    the runs of the script into ``run_root`` made (from their ``RUN/outputs/<phase>.json``)."""
    out = []
    outputs = Path(run_root) / OUTPUTS_DIR
    for summary in sorted(outputs.glob("*.json")) + sorted(outputs.glob("*/*.json")):
        try:
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "phase" in data and isinstance(data.get("outside"), list):
            out += [f"{data['phase']}: {w}" for w in data["outside"]]
    return out
