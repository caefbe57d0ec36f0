"""The job file (``job.yaml``) as one frozen dataclass tree.

Every key is documented in docs/job-file.md. Loading checks types and unknown keys and
raises :class:`ConfigError` naming the dotted key path (``iterations.warmup``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

__all__ = ["JobConfig", "Iterations", "Parallelism", "ValuesPolicy", "CommInputs", "load_job", "job_from_dict",
           "job_to_dict"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Iterations:
    warmup: int = 1
    """Steps at the start that are run and recorded but left out of timing statistics."""
    measured: int = 3
    """Steps after the warmup whose times are reported."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """The job's parallel shape. Informational: used to check world_size and build templates."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    """Expert parallelism; experts are sharded inside the dp*tp ranks, so it does not multiply."""
    cp: int = 1

    @property
    def product(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True, kw_only=True, slots=True)
class ValuesPolicy:
    """Which comm payloads ``prism collect`` stores in RUN/payloads (docs/job-file.md)."""

    record: str = "small"
    """``small``: outputs of at most ``small_max_bytes`` always (control flow: dataloader status,
    token ids, MoE split sizes, loss-scale flags), larger ones for ``ranks``; ``none``: nothing."""
    small_max_bytes: int = 65536
    """Size limit of an op's outputs (per rank) that is always recorded."""
    ranks: str = ""
    """Rank ranges (``0-3,8``) whose outputs of any size, and inputs, are recorded too."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommInputs:
    """Where ``prism collect`` takes the values of comm ops from (paper §5.2)."""

    source: str = "context_switch"
    """``context_switch``: run all ranks on the slots, values from the CPU collective executor.
    ``recorded``: every rank runs alone, in rounds of ``slots``, and each comm op returns the output
    recorded by an earlier collection (``run``, collected with ``values.ranks`` covering every rank)."""
    run: str = ""
    """``recorded``: the earlier run directory (relative paths resolve against the job file)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    name: str
    """A short name for the job, used in reports and run directory names."""
    entrypoint: str
    """The training script: a path (relative to the job file) or ``-m package.module``."""
    args: tuple[str, ...] = ()
    """Command-line arguments passed to the script unchanged."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank."""
    world_size: int
    """W, the number of logical ranks of the target job."""
    ranks_per_node: int = 8
    """Ranks per node of the target cluster; sets LOCAL_WORLD_SIZE and GROUP_RANK."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    iterations: Iterations = field(default_factory=Iterations)
    parallelism: Parallelism | None = None
    """When given, dp*tp*pp*cp must equal world_size."""
    slots: int = 1
    """K, the number of physical slots (devices, or process budget on CPU) prism may use."""
    values: ValuesPolicy = field(default_factory=ValuesPolicy)
    """Payload recording policy of ``prism collect``."""
    comm_inputs: CommInputs = field(default_factory=CommInputs)
    """Value source of ``prism collect``."""
    base_dir: str = "."
    """Directory the job file was loaded from (not a YAML key): relative paths resolve here."""

    @property
    def is_module(self) -> bool:
        return self.entrypoint.startswith("-m ")

    @property
    def module(self) -> str:
        assert self.is_module
        return self.entrypoint[3:].strip()

    @property
    def script_path(self) -> Path:
        assert not self.is_module
        return (Path(self.base_dir) / self.entrypoint).resolve()


_NOT_KEYS = {"base_dir"}


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        assert len(options) == 1
        return _convert(value, options[0], key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is tuple:
        if isinstance(value, str):
            raise ConfigError(key, "expected a list of strings, got a string (write [a, b])")
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {type(value).__name__}")
        return tuple(_convert(v, str, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
        out = {}
        for k, v in value.items():
            if not isinstance(v, (str, int, float, bool)):
                raise ConfigError(f"{key}.{k}", f"expected a scalar, got {type(v).__name__}")
            out[str(k)] = str(v) if not isinstance(v, bool) else str(v).lower()
        return out
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {tp} at {key}")


def _build(cls: Any, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _NOT_KEYS}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(key, f"unknown key (known keys here: {known})")
        kwargs[k] = _convert(v, hints[k], key)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}.{name}" if prefix else name, "required key is missing")
    return cls(**kwargs)


def _positive(key: str, value: int, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _check(job: JobConfig) -> None:
    if not job.name:
        raise ConfigError("name", "must not be empty")
    if not job.entrypoint.strip() or job.entrypoint.strip() == "-m":
        raise ConfigError("entrypoint", "must be a script path or '-m package.module'")
    _positive("world_size", job.world_size)
    _positive("ranks_per_node", job.ranks_per_node)
    _positive("slots", job.slots)
    _positive("iterations.warmup", job.iterations.warmup, allow_zero=True)
    _positive("iterations.measured", job.iterations.measured)
    if job.device not in ("cpu", "cuda"):
        raise ConfigError("device", f"must be 'cpu' or 'cuda', got {job.device!r}")
    p = job.parallelism
    if p is not None:
        for name in ("dp", "tp", "pp", "ep", "cp"):
            _positive(f"parallelism.{name}", getattr(p, name))
        if p.product != job.world_size:
            raise ConfigError(
                "parallelism",
                f"dp*tp*pp*cp = {p.dp}*{p.tp}*{p.pp}*{p.cp} = {p.product} "
                f"but world_size is {job.world_size}",
            )
        if (p.dp * p.tp) % p.ep:
            raise ConfigError("parallelism.ep", f"ep={p.ep} must divide dp*tp={p.dp * p.tp}")
    if job.values.record not in ("small", "none"):
        raise ConfigError("values.record", f"must be 'small' or 'none', got {job.values.record!r}")
    _positive("values.small_max_bytes", job.values.small_max_bytes, allow_zero=True)
    if job.values.ranks:
        from .ranks import parse_rank_ranges

        try:
            parse_rank_ranges(job.values.ranks, job.world_size)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError("values.ranks", str(e)) from e
    if job.comm_inputs.source not in ("context_switch", "recorded"):
        raise ConfigError("comm_inputs.source",
                          f"must be 'context_switch' or 'recorded', got {job.comm_inputs.source!r}")
    if job.comm_inputs.source == "recorded" and not job.comm_inputs.run:
        raise ConfigError("comm_inputs.run", "comm_inputs.source 'recorded' needs the run directory to read")
    if not job.is_module and not job.script_path.is_file():
        raise ConfigError("entrypoint", f"script not found: {job.script_path}")
    assert math.isfinite(job.world_size)


def job_from_dict(data: Any, *, base_dir: str | os.PathLike[str] = ".", source: str | None = None) -> JobConfig:
    """Build and check a job from parsed YAML. ``base_dir`` anchors a relative entrypoint."""
    if not isinstance(data, dict):
        raise ConfigError("", f"a job file must be a mapping, got {type(data).__name__}", source=source)
    try:
        job = _build(JobConfig, data, "")
        job = dataclasses.replace(job, base_dir=str(Path(base_dir).resolve()))
        _check(job)
    except ConfigError as e:
        if source and not str(e).startswith(source):
            raise ConfigError(e.key, e.detail, source=source) from None
        raise
    return job


def load_job(path: str | os.PathLike[str]) -> JobConfig:
    """Load and check ``job.yaml``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("", f"job file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError("", f"not valid YAML: {e}", source=str(p)) from e
    return job_from_dict(data, base_dir=p.parent, source=str(p))


def job_to_dict(job: JobConfig) -> dict[str, Any]:
    """The YAML form of a job (for the frozen copy in RUN/job.yaml)."""
    out = dataclasses.asdict(job)
    out.pop("base_dir")
    out["args"] = list(job.args)
    if job.parallelism is None:
        out.pop("parallelism")
    for key, default in (("values", ValuesPolicy()), ("comm_inputs", CommInputs())):
        if getattr(job, key) == default:
            out.pop(key)
    return out
