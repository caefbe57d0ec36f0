"""The job file (``job.yaml``) as one frozen dataclass tree.

Every key is documented in docs/job-file.md. Loading checks types and unknown keys and
raises :class:`ConfigError` naming the dotted key path (``iterations.warmup``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .boundary import check_in_script, parse_boundary
from .errors import ConfigError

__all__ = ["JobConfig", "Isolation", "ISOLATION_MODES", "Iterations", "Parallelism", "MoeRouter", "BalanceRatio",
           "MOE_ROUTER_ENV", "ROUTER_LOG_GLOB", "ValuesPolicy", "CommInputs", "CommRule", "load_job",
           "job_from_dict", "job_to_dict", "MESH_DIMS", "COMM_OP_NAMES", "RULE_FILLS", "FILLERS", "CONTROL_FLOW_DTYPES",
           "normalize_dtype"]

MESH_DIMS = ("pp", "dp", "cp", "tp")
MOE_ROUTER_ENV = "PRISM_MOE_ROUTER"
"""How the workers get the job's ``moe_router`` (JSON; prism.sandbox.moe_router installs it)."""
ROUTER_LOG_GLOB = "rank-*.moe_router.json"
"""The router's per-rank log of what it sent per gating call (in the worker's out dir)."""
"""The default mesh order (outermost first) of ``parallelism.mesh``: torchtitan's and the hybrid
example's ``init_device_mesh(device, (pp, dp, tp))``; rank = ((pp*dp + dp)*cp + cp)*tp + tp."""
COMM_OP_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                 "scatter", "barrier", "recv")
"""What ``comm_inputs.rules[].op`` may name (a send has no output, so no rule applies to it)."""
FILLERS = ("mirror", "zeros", "ones")
"""Values of ``comm_inputs.filler``."""
RULE_FILLS = (*FILLERS, "exact")
"""Values of ``comm_inputs.rules[].fill``."""
_DTYPE_ALIASES = {
    "f32": "float32", "float": "float32", "f64": "float64", "double": "float64", "f16": "float16", "half": "float16",
    "bf16": "bfloat16", "i64": "int64", "long": "int64", "i32": "int32", "int": "int32", "i16": "int16",
    "short": "int16", "i8": "int8", "u8": "uint8", "bool": "bool", "float32": "float32", "float64": "float64",
    "float16": "float16", "bfloat16": "bfloat16", "int64": "int64", "int32": "int32", "int16": "int16",
    "int8": "int8", "uint8": "uint8",
}
CONTROL_FLOW_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")


@dataclass(frozen=True, kw_only=True, slots=True)
class Iterations:
    warmup: int = 1
    """Steps at the start that are run and recorded but left out of timing statistics."""
    measured: int = 3
    """Steps after the warmup whose times are reported."""
    boundary: str = ""
    """Where a step ends when the script steps no optimizer: ``FILE.py:LINE`` (the statement there
    finishes), ``module:function`` or ``function`` (a call returns). Empty: ``optimizer.step``,
    ``prism.mark_step()``, else the period of each rank's comm sequence (prism.core.boundary)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BalanceRatio:
    """The distribution of the MoE balance ratio (tokens a rank's experts get over the even share)
    over one iteration's gating calls and the ranks of an EP group (PrismLLM appendix F)."""

    min: float
    max: float
    avg: float = 1.0
    """1 by definition (an EP group's tokens are conserved); other values are refused."""
    std: float
    med: float
    skew: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeRouter:
    """The MoE mock router (docs/moe-router.md): overwrite a gate's logits in place so expert loads
    follow a balance-ratio distribution."""

    gate: str
    """``Class.attr.path``: the submodule ``attr.path`` of every module of class ``Class`` is the
    gate; its output (``[tokens, experts]`` logits) is overwritten."""
    br: BalanceRatio
    ep: int = 0
    """EP group size (consecutive blocks of ranks); 0 = ``parallelism.ep``."""
    experts_per_rank: int = 0
    """0 = the logits' last dimension / ep."""
    seed: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """The job's parallel shape. Informational: used to check world_size and build templates."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    """Expert parallelism; experts are sharded inside the dp*tp ranks, so it does not multiply."""
    cp: int = 1
    mesh: tuple[str, ...] = MESH_DIMS
    """Order of the mesh dimensions, outermost first (a permutation of pp, dp, cp, tp): how ranks
    map to coordinates, as in ``init_device_mesh(device, (pp, dp, tp))``. Used by DP templates."""

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
class CommRule:
    """One rule of ``comm_inputs.rules`` (docs/job-file.md): match keys (all given ones must
    hold) and exactly one action (``value``, ``fill`` or ``hook``). The first matching rule wins."""

    op: tuple[str, ...] = ()
    """Op kinds (``all_to_all``, ``broadcast``, ...); empty: any."""
    call_site: str = ""
    """``fnmatch`` pattern of the op's call site ``file.py:line`` (``train.py:9*``); empty: any."""
    dtype: tuple[str, ...] = ()
    """Output dtypes (torch names; ``i64``/``f32``/``bf16`` are accepted); empty: any."""
    group_size: int = 0
    """Members of the op's group; 0: any."""
    max_bytes: int = -1
    """Only ops whose outputs (this rank's) are at most this many bytes; -1: any size."""
    ranks: str = ""
    """Rank ranges (``0-3,8``) the rule applies to; empty: every rank."""
    value: float | int | bool | list | None = None
    """Action: every output tensor is this number, or this (nested) list broadcast to its shape."""
    fill: str = ""
    """Action: ``mirror``, ``zeros``, ``ones`` (filler kinds) or ``exact`` (the CPU executor computes the real
    output from every member's inputs: the ranks wait for each other, i.e. context switches)."""
    hook: str = ""
    """Action: ``file.py:function`` (relative to the job file) or ``package.module:function``, called with
    the op's description and this rank's input tensors; returns the output tensor(s), or None for the filler."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommInputs:
    """Where ``prism collect`` takes the values of comm ops from (paper §5.2)."""

    source: str = "context_switch"
    """``context_switch``: run all ranks on the slots, values from the CPU collective executor.
    ``recorded``: every rank runs alone, in rounds of ``slots``, and each comm op returns the output
    recorded by an earlier collection (``run``, collected with ``values.ranks`` covering every rank).
    ``rules``: every rank runs alone; outputs come from ``rules`` (first match), else from ``filler``."""
    run: str = ""
    """``recorded``: the earlier run directory (relative paths resolve against the job file)."""
    rules: tuple[CommRule, ...] = ()
    """``rules`` (and, with DP templates, ops whose group spans DP replicas): user rules, tried in order."""
    control_flow: str = "exact"
    """A built-in last rule for integer/bool ops of at most ``values.small_max_bytes`` per rank (split sizes,
    token ids, status and NaN flags): ``exact`` (the CPU executor, faithful) or ``filler``."""
    filler: str = "mirror"
    """Outputs of ops no rule decides: ``mirror`` (what the op would return if every member had handed in this
    rank's inputs: all-reduce sum n*x, avg x, all-gather n copies, ...), ``zeros`` or ``ones``."""


ISOLATION_MODES = ("copy", "off")
"""Values of ``isolation.mode``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Isolation:
    """Where the script runs (docs/isolation.md): every run of it (record, collect, the capture run,
    each calibration slice, each emulation) in a copy of its folder of its own, so that what one run
    writes (checkpoints, snapshots, logs) is never read by the next."""

    mode: str = "copy"
    """``copy``: each run in a fresh copy of the snapshot of the script's folder, what it wrote kept under
    ``RUN/outputs/<phase>/``; ``off``: every run in the script's folder itself."""
    share: tuple[str, ...] = ()
    """Glob patterns (relative to the script's folder) of entries linked into each copy instead of copied:
    read-only data sets, environments. ``.git``, ``.venv``, ``venv``, ``node_modules`` always are."""
    extra: tuple[str, ...] = ()
    """Paths outside the script's folder that the script writes (relative paths resolve against the job
    file): each run finds them as they were when the snapshot was taken, what it wrote there is moved
    to ``RUN/outputs/<phase>/extra/``, and they are put back as they were after the run."""
    max_copy_bytes: int = 64 << 20
    """Files larger than this are linked, not copied (they are read, not written, by most scripts)."""


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
    templates: str = "none"
    """``dp``: ranks that differ only in their DP coordinate share one template; ``prism collect`` runs one
    DP replica (needs ``parallelism`` with dp > 1). ``none``: every rank runs."""
    isolation: Isolation = field(default_factory=Isolation)
    """Where each run of the script runs (its working directory)."""
    memory_cap_bytes: int = 0
    """Per-rank memory cap (0: none) applied by ``prism record`` and ``prism emulate``: a rank whose
    memory would exceed it fails with ``torch.OutOfMemoryError`` (CPU: the tracked storage bytes;
    CUDA: the caching allocator, ``torch.cuda.set_per_process_memory_fraction``)."""
    moe_router: MoeRouter | None = None
    """The MoE mock router plug-in (docs/moe-router.md); None: off."""
    base_dir: str = "."
    """Directory the job file was loaded from (not a YAML key): relative paths resolve here."""

    def rank_env(self) -> dict[str, str]:
        """The environment every rank worker gets: ``env`` plus the plug-ins' settings."""
        env = dict(self.env)
        if self.moe_router is not None:
            env[MOE_ROUTER_ENV] = json.dumps(dataclasses.asdict(self.moe_router) | {"ep": self.router_ep})
        return env

    @property
    def router_ep(self) -> int:
        assert self.moe_router is not None
        return self.moe_router.ep or (self.parallelism.ep if self.parallelism is not None else 1)

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


_RULE_VALUE = float | int | bool | list | None
_STR_OR_LIST = {"op", "dtype", "mesh"}
"""Keys that take one name or a list of names."""


def _rule_value(value: Any, key: str) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, list) and value:
        for i, v in enumerate(value):
            _rule_value(v, f"{key}[{i}]")
        return value
    raise ConfigError(key, f"expected a number or a non-empty (nested) list of numbers, got {value!r}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    if tp == _RULE_VALUE:
        return None if value is None else _rule_value(value, key)
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
    if origin is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list of mappings, got {type(value).__name__}")
        return tuple(_convert(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is tuple and key.rsplit(".", 1)[-1] in _STR_OR_LIST:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not value:
            raise ConfigError(key, f"expected a name or a non-empty list of names, got {value!r}")
        return tuple(_convert(v, str, f"{key}[{i}]") for i, v in enumerate(value))
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
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
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
    _positive("memory_cap_bytes", job.memory_cap_bytes, allow_zero=True)
    _positive("iterations.warmup", job.iterations.warmup, allow_zero=True)
    _positive("iterations.measured", job.iterations.measured)
    if job.iterations.boundary:
        boundary = parse_boundary(job.iterations.boundary)
        if not job.is_module:
            check_in_script(boundary, job.script_path)
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
    _check_comm_inputs(job)
    _check_templates(job)
    if job.isolation.mode not in ISOLATION_MODES:
        raise ConfigError("isolation.mode", f"must be one of {', '.join(ISOLATION_MODES)}, got {job.isolation.mode!r}")
    _positive("isolation.max_copy_bytes", job.isolation.max_copy_bytes, allow_zero=True)
    _check_router(job)
    if not job.is_module and not job.script_path.is_file():
        raise ConfigError("entrypoint", f"script not found: {job.script_path}")
    assert math.isfinite(job.world_size)


def _check_comm_inputs(job: JobConfig) -> None:
    ci = job.comm_inputs
    if ci.source not in ("context_switch", "recorded", "rules"):
        raise ConfigError("comm_inputs.source",
                          f"must be 'context_switch', 'recorded' or 'rules', got {ci.source!r}")
    if ci.source == "recorded" and not ci.run:
        raise ConfigError("comm_inputs.run", "comm_inputs.source 'recorded' needs the run directory to read")
    if ci.control_flow not in ("exact", "filler"):
        raise ConfigError("comm_inputs.control_flow", f"must be 'exact' or 'filler', got {ci.control_flow!r}")
    if ci.filler not in FILLERS:
        raise ConfigError("comm_inputs.filler", f"must be one of {', '.join(FILLERS)}, got {ci.filler!r}")
    for i, rule in enumerate(ci.rules):
        _check_rule(rule, f"comm_inputs.rules[{i}]", job)


def normalize_dtype(name: str) -> str | None:
    """The torch name of a dtype as users write it (``i64`` -> ``int64``), or None."""
    return _DTYPE_ALIASES.get(name.removeprefix("torch."))


def _check_rule(rule: CommRule, key: str, job: JobConfig) -> None:
    for op in rule.op:
        if op not in COMM_OP_NAMES:
            hint = " (a send has no output; write a rule for the recv)" if op == "send" else ""
            raise ConfigError(f"{key}.op", f"unknown op {op!r}{hint} (known: {', '.join(COMM_OP_NAMES)})")
    for dt in rule.dtype:
        if normalize_dtype(dt) is None:
            raise ConfigError(f"{key}.dtype", f"unknown dtype {dt!r} (e.g. int64, float32, bfloat16, bool)")
    if rule.group_size < 0:
        raise ConfigError(f"{key}.group_size", f"must be >= 0, got {rule.group_size}")
    if rule.max_bytes < -1:
        raise ConfigError(f"{key}.max_bytes", f"must be >= 0 (or -1: any size), got {rule.max_bytes}")
    if rule.ranks:
        from .ranks import parse_rank_ranges

        try:
            parse_rank_ranges(rule.ranks, job.world_size)
        except ValueError as e:
            raise ConfigError(f"{key}.ranks", str(e)) from e
    actions = [name for name in ("value", "fill", "hook") if getattr(rule, name) not in (None, "")]
    if len(actions) != 1:
        raise ConfigError(key, "needs exactly one action: value, fill or hook"
                          + (f" (got {', '.join(actions)})" if actions else ""))
    if rule.fill and rule.fill not in RULE_FILLS:
        raise ConfigError(f"{key}.fill", f"must be one of {', '.join(RULE_FILLS)}, got {rule.fill!r}")
    if rule.fill == "exact" and rule.ranks:
        raise ConfigError(f"{key}.ranks", "an 'exact' rule must hold for every member of an op (the members "
                          "wait for each other); drop ranks")
    if rule.hook:
        where, sep, func = rule.hook.rpartition(":")
        if not sep or not where or not func.isidentifier():
            raise ConfigError(f"{key}.hook", f"expected 'file.py:function' or 'package.module:function', "
                              f"got {rule.hook!r}")
        if where.endswith(".py") and not (Path(job.base_dir) / where).is_file():
            raise ConfigError(f"{key}.hook", f"file not found: {Path(job.base_dir) / where}")


def _check_router(job: JobConfig) -> None:
    r = job.moe_router
    if r is None:
        return
    if r.gate.count(".") < 1 or not all(part.isidentifier() for part in r.gate.split(".")):
        raise ConfigError("moe_router.gate", f"expected 'Class.attribute' (e.g. MoEModel.router), got {r.gate!r}")
    if job.router_ep < 2 or job.world_size % job.router_ep:
        raise ConfigError("moe_router.ep", f"must be > 1 and divide world_size {job.world_size}, got {job.router_ep}")
    _positive("moe_router.experts_per_rank", r.experts_per_rank, allow_zero=True)
    br = r.br
    if abs(br.avg - 1.0) > 1e-6:
        raise ConfigError("moe_router.br.avg", f"must be 1 (the tokens of an EP group are conserved), got {br.avg}")
    if not 0 <= br.min <= br.med <= br.max or not br.min <= 1.0 <= br.max:
        raise ConfigError("moe_router.br", f"need 0 <= min <= med <= max and min <= 1 <= max, got min {br.min}, "
                          f"med {br.med}, max {br.max}")
    if br.max > job.router_ep:
        raise ConfigError("moe_router.br.max", f"a rank cannot get more than all {job.router_ep} shares, got {br.max}")
    if br.std < 0:
        raise ConfigError("moe_router.br.std", f"must be >= 0, got {br.std}")


def _check_templates(job: JobConfig) -> None:
    if job.parallelism is not None and sorted(job.parallelism.mesh) != sorted(MESH_DIMS):
        raise ConfigError("parallelism.mesh", f"must order all of {', '.join(MESH_DIMS)} (outermost first), "
                          f"got {list(job.parallelism.mesh)}")
    if job.templates not in ("none", "dp"):
        raise ConfigError("templates", f"must be 'none' or 'dp', got {job.templates!r}")
    if job.templates == "dp" and (job.parallelism is None or job.parallelism.dp < 2):
        raise ConfigError("templates", "'dp' needs parallelism.dp > 1 (the DP replicas that share templates)")
    if job.templates == "dp" and job.values.ranks:
        raise ConfigError("values.ranks", "full values are not collected with templates: dp (one DP replica runs)")


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
    if not job.memory_cap_bytes:
        out.pop("memory_cap_bytes")
    if not job.iterations.boundary:
        out["iterations"].pop("boundary")
    if job.parallelism is None:
        out.pop("parallelism")
    else:
        out["parallelism"]["mesh"] = list(job.parallelism.mesh)
    for key, default in (("values", ValuesPolicy()), ("comm_inputs", CommInputs()), ("isolation", Isolation())):
        if getattr(job, key) == default:
            out.pop(key)
    if "isolation" in out:
        out["isolation"]["share"] = list(job.isolation.share)
        # Absolute: the frozen copy in RUN/job.yaml lives elsewhere.
        out["isolation"]["extra"] = [str((Path(job.base_dir) / p).resolve()) for p in job.isolation.extra]
    if "comm_inputs" in out:
        # Paths become absolute: the frozen copy in RUN/job.yaml lives elsewhere.
        rules = []
        for r in job.comm_inputs.rules:
            rule = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(r).items()
                    if v != getattr(CommRule(), k)}
            where, _, func = r.hook.rpartition(":")
            if where.endswith(".py"):
                rule["hook"] = f"{(Path(job.base_dir) / where).resolve()}:{func}"
            rules.append(rule)
        out["comm_inputs"]["rules"] = rules
        if job.comm_inputs.run:
            out["comm_inputs"]["run"] = str((Path(job.base_dir) / job.comm_inputs.run).resolve())
    if job.templates == "none":
        out.pop("templates")
    if job.moe_router is None:
        out.pop("moe_router")
    return out
