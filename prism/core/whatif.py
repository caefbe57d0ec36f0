"""What a what-if emulation changes on the sandbox ranks (``prism emulate --env/--args/--entrypoint``,
docs/whatif.md): the sandbox ranks run the changed program; the vranks keep the recorded job's
behaviour."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config import JobConfig
from .errors import ConfigError

__all__ = ["SandboxChange", "parse_env_items"]


@dataclass(frozen=True, slots=True)
class SandboxChange:
    env: tuple[tuple[str, str], ...] = ()
    """Set (or override) these environment variables in the sandbox ranks only."""
    args: tuple[str, ...] | None = None
    """Replace the script's arguments (None: the recorded job's)."""
    entrypoint: str = ""
    """Run this script instead of the recorded one ("" = the recorded one); an absolute path."""

    @property
    def is_empty(self) -> bool:
        return not self.env and self.args is None and not self.entrypoint

    def describe(self) -> dict:
        """The change as report.json names it (only what is changed)."""
        out: dict = {}
        if self.env:
            out["env"] = dict(self.env)
        if self.args is not None:
            out["args"] = list(self.args)
        if self.entrypoint:
            out["entrypoint"] = self.entrypoint
        return out

    def summary(self) -> str:
        parts = [f"{k}={v}" for k, v in self.env]
        if self.args is not None:
            parts.append("args " + " ".join(self.args))
        if self.entrypoint:
            parts.append(f"entrypoint {self.entrypoint}")
        return ", ".join(parts) or "unchanged"

    def apply(self, job: JobConfig) -> JobConfig:
        """The job the sandbox ranks run."""
        if self.is_empty:
            return job
        changes: dict = {"env": {**job.env, **dict(self.env)}}
        if self.args is not None:
            changes["args"] = tuple(self.args)
        if self.entrypoint:
            path = Path(self.entrypoint)
            if not path.is_file():
                raise ConfigError("--entrypoint", f"{path}: no such file")
            changes["entrypoint"] = str(path.resolve())
        return dataclasses.replace(job, **changes)


def parse_args_text(text: str, flag: str) -> tuple[str, ...]:
    """A script's arguments given as one shell-quoted string (``--args``) → the argument list."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ConfigError(flag, f"{text!r}: {e}; quote the arguments as a shell would") from None


def parse_env_items(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings (``--env``, repeatable) → pairs, in order (a later KEY wins)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or any(c.isspace() for c in key):
            raise ConfigError("--env", f"{item!r}: expected KEY=VALUE")
        out[key] = value
    return tuple(out.items())
