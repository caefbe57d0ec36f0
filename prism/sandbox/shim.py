"""The sandbox shim: run an unmodified script as logical rank R of W.

``install`` prepares the process: logical environment variables, the ``"prism"`` backend, the
redirection of every ``init_process_group``/``new_group`` to it, the store, the store-based
barrier fix-up for missing ranks, and the recorder's hooks. ``run_entrypoint`` then starts the
script with runpy as ``__main__``.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import runpy
import sys
import types

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from prism.core.workerspec import ShimConfig

from . import backend as pg_backend
from .boundary import BoundaryHook
from .engines.base import CommEngine
from .recorder import Recorder

__all__ = ["ShimConfig", "Sandbox", "install", "run_entrypoint", "current_sandbox"]

log = logging.getLogger(__name__)


class Sandbox:
    def __init__(self, config: ShimConfig, engine: CommEngine, recorder: Recorder, store: dist.Store,
                 boundary: BoundaryHook | None = None) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.store = store
        self.boundary = boundary


_current: Sandbox | None = None


def current_sandbox() -> Sandbox | None:
    return _current


def _logical_env(cfg: ShimConfig) -> dict[str, str]:
    host, _, port = cfg.store_addr.partition(":")
    return {
        "RANK": str(cfg.rank),
        "WORLD_SIZE": str(cfg.world_size),
        "LOCAL_RANK": str(cfg.local_rank),
        "LOCAL_WORLD_SIZE": str(min(cfg.ranks_per_node, cfg.world_size)),
        "GROUP_RANK": str(cfg.rank // cfg.ranks_per_node),
        "NODE_RANK": str(cfg.rank // cfg.ranks_per_node),
        "ROLE_RANK": str(cfg.rank),
        "MASTER_ADDR": host or "127.0.0.1",
        "MASTER_PORT": port or "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def _make_store(cfg: ShimConfig) -> dist.Store:
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    if not cfg.store_addr:
        return dist.HashStore()
    host, _, port = cfg.store_addr.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timeout, wait_for_workers=False)


def _patch_c10d(cfg: ShimConfig, store: dist.Store) -> None:
    original_helper = c10d._new_process_group_helper

    extra_names = ("backend_options", "timeout", "pg_tag", "device_id", "group_desc")

    @functools.wraps(original_helper)
    def helper(group_size, group_rank, global_ranks_in_group, backend, store_, group_name, *args, **kwargs):
        # Whatever the script asked for (nccl, gloo, "cpu:gloo,cuda:nccl"), the group is ours.
        # device_id would trigger eager NCCL init and split-based subgroups; drop it.
        if group_rank is None or group_rank < 0:  # not a member: c10d returns at once (DeviceMesh makes W/n of these)
            return original_helper(group_size, group_rank, global_ranks_in_group, backend, store_, group_name, *args, **kwargs)
        kwargs.update(zip(extra_names, args))
        kwargs.pop("device_id", None)
        kwargs.pop("backend_options", None)
        return original_helper(
            group_size, group_rank, global_ranks_in_group, pg_backend.BACKEND_NAME, store_, group_name, **kwargs
        )

    c10d._new_process_group_helper = helper

    def rendezvous(url, rank=-1, world_size=-1, **kwargs):
        # The shim owns rendezvous: env:// would wait for W TCPStore clients that never come.
        yield (store, cfg.rank, cfg.world_size)

    c10d.rendezvous = rendezvous

    original_barrier = c10d._store_based_barrier
    present = cfg.present_ranks or cfg.world_size

    @functools.wraps(original_barrier)
    def store_based_barrier(rank, store_, group_name, rendezvous_count, timeout, *args, **kwargs):
        missing = rendezvous_count - min(present, rendezvous_count)
        if missing > 0 and cfg.is_store_leader:
            # paper §6.2: a leader checks in on behalf of the ranks that do not run here.
            store_.add(f"{c10d.STORE_BASED_BARRIER_PREFIX}:{group_name}", missing)
        return original_barrier(rank, store_, group_name, rendezvous_count, timeout, *args, **kwargs)

    c10d._store_based_barrier = store_based_barrier


def _install_hooks(recorder: Recorder, boundary: BoundaryHook | None) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if boundary is not None:
        boundary.install()  # the job says where steps end: optimizer steps do not
    else:
        register_optimizer_step_post_hook(lambda *_a, **_k: recorder.mark_step(from_optimizer=True))
    original_backward = torch.autograd.backward

    @functools.wraps(original_backward)
    def backward(tensors, *args, **kwargs):
        roots = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        recorder.on_backward_root(roots)
        return original_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward


def install(cfg: ShimConfig, engine: CommEngine) -> Sandbox:
    """Make this process logical rank ``cfg.rank`` of ``cfg.world_size`` (once per process)."""
    global _current
    assert _current is None, "the sandbox is installed once per process"
    os.environ.update(_logical_env(cfg))
    recorder = Recorder(cfg.rank, cfg.world_size, sync_cuda=cfg.device == "cuda", clock_origin_ns=cfg.clock_origin_ns)
    store = _make_store(cfg)
    pg_backend.set_context(
        pg_backend.SandboxContext(engine, recorder, world_size=cfg.world_size, rank=cfg.rank)
    )
    pg_backend.register_backend()
    _patch_c10d(cfg, store)
    boundary = BoundaryHook(cfg.boundary, recorder.mark_step) if cfg.boundary else None
    _install_hooks(recorder, boundary)
    _current = Sandbox(cfg, engine, recorder, store, boundary)
    return _current


def run_entrypoint(entrypoint: str, args: list[str] | tuple[str, ...], *, cwd: str | None = None) -> None:
    """Run ``script.py`` or ``-m module`` as ``__main__`` with ``args`` as its argv."""
    if cwd:
        os.chdir(cwd)
    boundary = _current.boundary if _current is not None else None
    if entrypoint.startswith("-m "):
        module = entrypoint[3:].strip()
        sys.argv = [module, *args]
        if boundary is not None:
            boundary.entry_module = module
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        path = os.path.abspath(entrypoint)
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(path))
        code = boundary.compile_entry(path) if boundary is not None else None
        if code is None:
            runpy.run_path(path, run_name="__main__")
        else:
            _run_as_main(code, path)
    if boundary is not None and _current is not None:
        boundary.report(_current.config.rank)


def _run_as_main(code, path: str) -> None:
    """What ``runpy.run_path`` does for a script, with code compiled here (the boundary rewritten
    into it): a fresh ``__main__`` module while it runs."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__="", __spec__=None)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
