"""``iterations.boundary``: where a step ends, for scripts that step no optimizer.

Three forms (docs/job-file.md):

* ``FILE.py:LINE`` — a step ends each time the statement at that line of that file finishes
  (``train.py:42``; ``FILE`` is matched against the end of the file's path).
* ``module:function`` — each time a call of that function returns (``qualname`` allowed:
  ``mypkg.loop:Trainer.step``; ``__main__`` or the entry script's file stem name the entry script).
* ``function`` — a function of the entry script.

This module parses the value and finds the statement or function in a syntax tree; the shim
(``prism.sandbox.boundary``) rewrites the code that holds it. Every error is a ConfigError naming
the key.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = ["Boundary", "parse_boundary", "locate_statement", "locate_function", "check_in_script", "KEY"]

KEY = "iterations.boundary"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_LINE = re.compile(r"^(?P<path>[^:]+\.py):(?P<line>[0-9]+)$")
_FUNC = re.compile(rf"^(?:(?P<module>{_IDENT}(?:\.{_IDENT})*):)?(?P<qualname>{_IDENT}(?:\.{_IDENT})*)$")


@dataclass(frozen=True, slots=True)
class Boundary:
    """A parsed ``iterations.boundary``: a line of a file, or a function (of a module, or of the
    entry script when ``module`` is empty)."""

    text: str
    path: str = ""
    line: int = 0
    module: str = ""
    qualname: str = ""

    @property
    def is_line(self) -> bool:
        return bool(self.path)

    def matches_file(self, filename: str) -> bool:
        """Whether ``filename`` is the file of a line boundary (its path ends with ``path``)."""
        want = Path(self.path).parts
        return Path(filename).parts[-len(want):] == want if want else False

    def names_entry(self, entry_stem: str) -> bool:
        """Whether a function boundary names the entry script (no module, ``__main__``, or its stem)."""
        return not self.is_line and self.module in ("", "__main__", entry_stem)


def parse_boundary(text: str) -> Boundary:
    """Parse the value of ``iterations.boundary``; ConfigError on anything else."""
    value = text.strip()
    if m := _LINE.match(value):
        line = int(m["line"])
        if line < 1:
            raise ConfigError(KEY, f"{text!r}: line numbers start at 1")
        return Boundary(value, path=m["path"], line=line)
    if value.partition(":")[0].endswith(".py"):
        raise ConfigError(KEY, f"{text!r}: FILE.py:LINE needs a line number after the colon (train.py:42)")
    if m := _FUNC.match(value):
        return Boundary(value, module=m["module"] or "", qualname=m["qualname"])
    raise ConfigError(KEY, f"{text!r} is neither FILE.py:LINE (train.py:42) nor module:function "
                           f"(mypkg.loop:train_step) nor a function of the entry script (train_step)")


def locate_statement(tree: ast.Module, line: int) -> ast.stmt | None:
    """The innermost statement that spans ``line``; None when the line holds none (blank, a
    comment, or a line of a block's body that no statement of the body covers)."""
    best: ast.stmt | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or (node.end_lineno or 0) - node.lineno <= (best.end_lineno or 0) - best.lineno:
                best = node
    body = getattr(best, "body", None)
    if best is not None and isinstance(body, list) and body and line >= body[0].lineno:
        return None  # inside the block, between its statements
    return best


def locate_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function whose qualified name (``Class.method``, nested functions by name) is ``qualname``."""
    found = None

    def visit(node: ast.AST, prefix: str) -> None:
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if found is None and not isinstance(child, ast.ClassDef) and name == qualname:
                    found = child
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def check_in_script(boundary: Boundary, script: Path) -> None:
    """When the boundary lies in the entry script, check that the script holds it (ConfigError
    naming the key and the file otherwise); a boundary elsewhere is checked when its module loads."""
    if boundary.is_line and not boundary.matches_file(str(script)):
        return
    if not boundary.is_line and not boundary.names_entry(script.stem):
        return
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError):
        return  # the script itself reports it when it runs
    if boundary.is_line:
        if locate_statement(tree, boundary.line) is None:
            raise ConfigError(KEY, f"{boundary.text!r}: line {boundary.line} of {script} holds no statement")
    elif locate_function(tree, boundary.qualname) is None:
        raise ConfigError(KEY, f"{boundary.text!r}: {script} defines no function {boundary.qualname!r}")
