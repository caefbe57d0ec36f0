"""The shim's side of ``iterations.boundary``: the code that holds the boundary is rewritten so that
the statement at ``FILE.py:LINE``, or the body of the named function, runs inside
``try: ... finally: <step end>``.

The rewrite happens when the code is compiled (the entry script when the shim runs it; another
module when it is imported: a meta path finder hands its source to a loader that rewrites it and
never writes the result to the bytecode cache; a module imported before the shim was installed gets
its function wrapped instead). The running program pays one small function call per step and
nothing else: no trace or profile hook.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable
from pathlib import Path

from prism.core.boundary import KEY, Boundary, locate_function, locate_statement, parse_boundary
from prism.core.errors import ConfigError

__all__ = ["BoundaryHook", "step_end"]

log = logging.getLogger(__name__)

_CALL = "__import__('prism.sandbox.boundary', fromlist=('step_end',)).step_end()"
_active: BoundaryHook | None = None


def step_end() -> None:
    """Called by rewritten code where the boundary is."""
    if _active is not None:
        _active.hits += 1
        _active.on_step()


def _guarded(stmts: list[ast.stmt], where: ast.stmt) -> ast.Try:
    call = ast.parse(_CALL).body[0]
    try_node = ast.Try(body=stmts, handlers=[], orelse=[], finalbody=[call])
    ast.copy_location(try_node, where)
    ast.copy_location(call, where)
    return try_node


def _replace_in_parent(tree: ast.AST, stmt: ast.stmt, new: ast.stmt) -> None:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                for i, s in enumerate(block):
                    if s is stmt:
                        block[i] = new
                        return
    raise AssertionError("a located statement has a parent block")


class BoundaryHook:
    """Installs one boundary for this process; ``on_step`` ends the recorder's step."""

    def __init__(self, text: str, on_step: Callable[[], None]) -> None:
        self.boundary: Boundary = parse_boundary(text)
        self.on_step = on_step
        self.hits = 0
        self.entry_file = ""
        self.entry_module = ""
        self.rewritten: list[str] = []

    # -- where it applies ------------------------------------------------------------------
    def _applies(self, filename: str, module: str, *, is_entry: bool) -> bool:
        b = self.boundary
        if b.is_line:
            return b.matches_file(filename)
        if is_entry:
            return b.names_entry(Path(filename).stem) or b.module == module
        return b.module == module

    def rewrite(self, tree: ast.Module, filename: str, module: str, *, is_entry: bool) -> bool:
        """Rewrite ``tree`` in place if the boundary lies in it; ConfigError if it should but does not."""
        if not self._applies(filename, module, is_entry=is_entry):
            return False
        b = self.boundary
        if b.is_line:
            stmt = locate_statement(tree, b.line)
            if stmt is None:
                raise ConfigError(KEY, f"{b.text!r}: line {b.line} of {filename} holds no statement")
            _replace_in_parent(tree, stmt, _guarded([stmt], stmt))
        else:
            fn = locate_function(tree, b.qualname)
            if fn is None:
                raise ConfigError(KEY, f"{b.text!r}: {filename} defines no function {b.qualname!r}")
            body = fn.body
            keep = 1 if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1 else 0
            fn.body = [*body[:keep], _guarded(body[keep:], body[keep])]
        ast.fix_missing_locations(tree)
        self.rewritten.append(filename)
        log.info("%s: a step ends at %s (%s)", KEY, b.text, filename)
        return True

    # -- installing --------------------------------------------------------------------------
    def install(self) -> None:
        global _active
        _active = self
        b = self.boundary
        if not b.is_line and b.module not in ("", "__main__") and b.module in sys.modules:
            self._wrap_loaded(sys.modules[b.module])
        sys.meta_path.insert(0, _Finder(self))

    def _wrap_loaded(self, module: types.ModuleType) -> None:
        """A module imported before the shim: wrap the function object itself."""
        *owners, name = self.boundary.qualname.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part, None)
        raw = vars(owner).get(name) if owner is not None else None
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        func = raw.__func__ if kind else raw
        if not callable(func):
            raise ConfigError(KEY, f"{self.boundary.text!r}: module {module.__name__} has no function "
                                   f"{self.boundary.qualname!r}")

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            finally:
                step_end()

        setattr(owner, name, kind(wrapper) if kind else wrapper)
        self.rewritten.append(module.__name__)

    def compile_entry(self, path: str) -> types.CodeType | None:
        """The entry script's code with the boundary in it, or None when the boundary is elsewhere."""
        self.entry_file = path
        if not self._applies(path, "__main__", is_entry=True):
            return None
        source = Path(path).read_bytes()
        tree = ast.parse(source, filename=path)
        self.rewrite(tree, path, "__main__", is_entry=True)
        return compile(tree, path, "exec", dont_inherit=True)

    def wants_module(self, fullname: str) -> bool:
        """A cheap first test, before the finder looks the module up."""
        b = self.boundary
        if b.is_line:
            stem = Path(b.path).stem
            return fullname.rsplit(".", 1)[-1] == stem or stem == "__init__"
        return fullname in (b.module, self.entry_module)

    def report(self, rank: int) -> None:
        if not self.rewritten:
            log.warning("rank %d: %s %r matched no code that ran (no such file was run or imported); the steps "
                        "come from the period of the comm sequence", rank, KEY, self.boundary.text)
        elif not self.hits:
            log.warning("rank %d: %s %r was never reached; the steps come from the period of the comm sequence",
                        rank, KEY, self.boundary.text)


class _Loader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, hook: BoundaryHook) -> None:
        super().__init__(fullname, path)
        self.hook = hook

    def get_code(self, fullname: str) -> types.CodeType:
        source = self.get_data(self.path)
        tree = ast.parse(source, filename=self.path)
        self.hook.rewrite(tree, self.path, fullname, is_entry=fullname == self.hook.entry_module)
        return compile(tree, self.path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, hook: BoundaryHook) -> None:
        self.hook = hook

    def find_spec(self, fullname, path, target=None):
        if not self.hook.wants_module(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader) or not spec.origin:
            return None
        if not self.hook._applies(spec.origin, fullname, is_entry=fullname == self.hook.entry_module):
            return None
        spec.loader = _Loader(fullname, spec.origin, self.hook)
        return spec
