#!/usr/bin/env python3
"""Generate the Python code of every protos/*.proto, or check that the committed code is current.

* A proto that declares no ``service`` (the PrismTrace schema) becomes ``prism/graph/_pb/<name>_pb2.py``
  and ``.pyi``: messages only, so prism.graph never needs grpc.
* A proto that declares a ``service`` becomes ``prism/rpc/_pb/<name>_pb2.py``, ``.pyi`` and
  ``_pb2_grpc.py``.

protoc writes ``import x_pb2``; the imports between generated modules are rewritten to
``from . import x_pb2`` (same package) or ``from prism.graph._pb import x_pb2`` (the other one).

Usage::

    python scripts/gen_protos.py           # regenerate in place
    python scripts/gen_protos.py --check   # regenerate into a temp dir and diff; exit 1 if stale

The generator is pinned: grpcio-tools 1.84.0 exactly, since another version emits different code
(and a different protobuf runtime requirement).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gen_protos")

GRPCIO_TOOLS_VERSION = "1.84.0"
ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
MESSAGES_PKG = "prism.graph._pb"
SERVICES_PKG = "prism.rpc._pb"
INIT_TEXT = '"""Generated protobuf code (scripts/gen_protos.py). Do not edit."""\n'

_SERVICE_RE = re.compile(r"^\s*service\s+\w+\s*\{", re.MULTILINE)
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_IMPORT_RE = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
_FROM_IMPORT_RE = re.compile(r"^from (\w+_pb2) import ", re.MULTILINE)


@dataclass(frozen=True)
class Proto:
    path: Path
    has_service: bool

    @property
    def module(self) -> str:
        return f"{self.path.stem}_pb2"

    @property
    def package(self) -> str:
        return SERVICES_PKG if self.has_service else MESSAGES_PKG


def _pkg_dir(root: Path, package: str) -> Path:
    return root.joinpath(*package.split("."))


def _check_tools_version() -> None:
    try:
        found = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(
            f"gen_protos: grpcio-tools is not installed; install grpcio-tools=={GRPCIO_TOOLS_VERSION} "
            "(pip install -e '.[test]')"
        )
    if found != GRPCIO_TOOLS_VERSION:
        sys.exit(
            f"gen_protos: grpcio-tools {found} is installed, but the generated code is pinned to "
            f"grpcio-tools=={GRPCIO_TOOLS_VERSION}; install that exact version "
            f"(pip install grpcio-tools=={GRPCIO_TOOLS_VERSION})"
        )


def discover(proto_dir: Path = PROTO_DIR) -> list[Proto]:
    protos = []
    for path in sorted(proto_dir.glob("*.proto")):
        text = _COMMENT_RE.sub("", path.read_text(encoding="utf-8"))
        protos.append(Proto(path, bool(_SERVICE_RE.search(text))))
    return protos


def _protoc(proto: Proto, out_dir: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    if proto.has_service:
        args.append(f"--grpc_python_out={out_dir}")
    args.append(str(proto.path))
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"gen_protos: protoc failed on {proto.path.relative_to(ROOT)}:\n{result.stderr}")


def _fix_imports(text: str, own_package: str, packages: dict[str, str]) -> str:
    """Rewrite protoc's absolute ``import x_pb2`` between generated modules."""

    def where(module: str) -> str | None:
        package = packages.get(module)
        if package is None:
            return None  # not ours (google.protobuf imports are already qualified)
        return "." if package == own_package else package

    def sub_import(m: re.Match[str]) -> str:
        src = where(m.group(1))
        return m.group(0) if src is None else f"from {src} import {m.group(1)} as {m.group(2)}"

    def sub_from(m: re.Match[str]) -> str:
        src = where(m.group(1))
        if src is None:
            return m.group(0)
        return f"from .{m.group(1)} import " if src == "." else f"from {src}.{m.group(1)} import "

    return _FROM_IMPORT_RE.sub(sub_from, _IMPORT_RE.sub(sub_import, text))


def generate(dest_root: Path) -> list[Path]:
    """Generate every proto's code under ``dest_root`` (a repo root); return the files written."""
    protos = discover()
    if not protos:
        sys.exit(f"gen_protos: no .proto files in {PROTO_DIR}")
    packages = {p.module: p.package for p in protos}
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="gen_protos.") as tmp:
        for proto in protos:
            out = Path(tmp) / proto.path.stem
            out.mkdir()
            _protoc(proto, out)
            pkg_dir = _pkg_dir(dest_root, proto.package)
            pkg_dir.mkdir(parents=True, exist_ok=True)
            init = pkg_dir / "__init__.py"
            if init not in written:
                init.write_text(INIT_TEXT, encoding="utf-8")
                written.append(init)
            for produced in sorted(out.iterdir()):
                text = _fix_imports(produced.read_text(encoding="utf-8"), proto.package, packages)
                target = pkg_dir / produced.name
                target.write_text(text, encoding="utf-8")
                written.append(target)
    return written


def _generated_files(root: Path) -> set[Path]:
    """Files under the generated packages that the generator owns (relative paths)."""
    found: set[Path] = set()
    for package in (MESSAGES_PKG, SERVICES_PKG):
        pkg_dir = _pkg_dir(root, package)
        if pkg_dir.is_dir():
            for f in pkg_dir.iterdir():
                if f.name == "__init__.py" or re.fullmatch(r"\w+_pb2(_grpc)?\.pyi?", f.name):
                    found.add(f.relative_to(root))
    return found


def check() -> int:
    with tempfile.TemporaryDirectory(prefix="gen_protos_check.") as tmp:
        fresh_root = Path(tmp)
        fresh = {p.relative_to(fresh_root) for p in generate(fresh_root)}
        committed = _generated_files(ROOT)
        stale: list[str] = []
        for rel in sorted(fresh):
            mine = ROOT / rel
            if not mine.exists():
                stale.append(f"{rel}: missing (generated from protos/ but not present)")
                continue
            want = (fresh_root / rel).read_text(encoding="utf-8")
            have = mine.read_text(encoding="utf-8")
            if want != have:
                lines = difflib.unified_diff(
                    have.splitlines(),
                    want.splitlines(),
                    f"{rel} (committed)",
                    f"{rel} (regenerated)",
                    n=1,
                    lineterm="",
                )
                shown = [line if len(line) <= 160 else line[:157] + "..." for line in list(lines)[:40]]
                diff = "\n".join(shown)
                stale.append(f"{rel}: stale\n{diff}")
        for rel in sorted(committed - fresh):
            stale.append(f"{rel}: no .proto in protos/ generates it (delete it)")
    if stale:
        for entry in stale:
            log.error("%s", entry)
        log.error("generated protobuf code is out of date; run `make protos` and commit the result")
        return 1
    log.info("generated protobuf code is current (%d files)", len(fresh))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    _check_tools_version()
    if args.check:
        return check()
    # Remove generated files no proto produces any more, then write the fresh ones.
    fresh = {p.relative_to(ROOT) for p in generate(ROOT)}
    for rel in _generated_files(ROOT) - fresh:
        (ROOT / rel).unlink()
        log.info("removed %s", rel)
    for rel in sorted(fresh):
        log.info("wrote %s", rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
