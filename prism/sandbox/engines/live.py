"""The ``live`` engine: a sandbox rank speaks the real (pruned) collective algorithms.

Every op becomes one pruned collective per tensor (:func:`~prism.nccl_patches.vplan.op_parts`),
run by :func:`~prism.nccl_patches.pruned.start_sandbox_side` (:func:`~prism.nccl_patches.run_sandbox_side`
in two halves) over the transport of the op's group. The
transport of a group connects its sandbox members and, when it has vranks, the replayer that
hosts them (:func:`~prism.nccl_patches.vplan.endpoint_plan`); sandbox members talk directly. A
group of two sandbox ranks and no vrank runs on a real gloo group instead (``passthrough``; outside
a capture run), as the device paths run every group of sandbox ranks (``_runs_real``). In an
emulation (``connect_groups``: the groups the graph shows this rank communicating on) a group's
transport connects when the script creates the group, as ProcessGroupGloo connects in its
constructor, so no measured step pays a connection the real run paid at start-up; groups that never
communicate get none (virtualized initialization), and pruned vranks none either. Without that list
(the capture run) a transport connects when the group is first used.

Ops run on one background thread per *channel* — the collectives of a group, and each
(src, dst, group) message stream — in issue order, so DDP (which waits on futures) and pipeline
schedules (which post a send and the opposite recv together) both progress. Futures complete
from those threads. A send or recv whose group transport is up is posted to gloo at once, on the
caller's thread (as the real backend does) and completed by the thread that waits for it, as
``passthrough`` does in the real run (``completion.WaitedFuture``); its channel thread waits for
it only when something else asks or the channel's next message comes first. Recorded data (needed
only for the divergence flag, never for a recv) is loaded ahead: a channel's records when it is
first used (:meth:`~prism.nccl_patches.recorded_store.RecordedStore.preload`, within a budget),
else a few ops ahead. A small send's flag is not computed in the script's wait: its bytes are
copied at the post and compared with the record in batches on a channel thread
(:meth:`LiveEngine._defer_send_check`). Runs that leave the flags to another pass of the same
emulation, or whose flags nobody reads, compare no send at all and load no send's record
(``flag_divergence=False``: the timed pass before a memory pass, calibration slices).

With ``PRISM_LIVE_EARLY_START=1`` a small collective (one CPU part of at most 1 MiB, its record
loaded, its channel idle) posts its first ring step on the script's thread at its issue, as gloo's
own thread starts at once, and its channel thread drives the rest (:meth:`LiveEngine._start_early`).
Off by default until measured on 16 cores (docs/emulate.md, "A 2-rank collective with a vrank
partner").

A group of two with one vrank runs its all-reduce, all-gather and reduce-scatter as one exchange
(:mod:`~prism.nccl_patches.pair`): checked and posted on the script's thread at its issue like a
message, completed by the thread that waits for it, the recorded output written then
(:meth:`LiveEngine._post_pair`, :meth:`LiveEngine._pair_outputs`).

With every rank a sandbox rank and no replayer (``sandbox`` = all), this is a real all-rank run
whose reductions follow prism's ring order, i.e. the values a collection produces; with
``capture_dir`` each rank saves its inputs and outputs of every op (the capture run from which
:func:`~prism.nccl_patches.recorded_store.derive_from_capture` builds recorded data).

Ops whose input differs bitwise from the recorded one are *diverged* (outputs are recorded + Δ);
they are listed in ``<out_dir>/rank-R.live.json`` with the op count, traffic and losses.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from prism.core.atomic import atomic_write_text
from prism.core.cprofile import profiled
from prism.core.errors import MismatchError, PrismError
from prism.core.layout import DEVICE_DATA_PATHS
from prism.graph.records import CommOp
from prism.nccl_patches.pruned import SandboxResult, start_sandbox_side
from prism.nccl_patches.compensation import (
    RecordedCollective,
    describe,
    host_bytes,
    matches_record,
    recorded_on_another_path,
    same_bits,
    same_bits_as,
)
from prism.nccl_patches import pair
from prism.nccl_patches.parties import SandboxParty
from prism.nccl_patches.recorded_store import RecordedStore, collective_key, p2p_key, write_capture
from prism.nccl_patches.schedule import Algo
from prism.nccl_patches.vplan import (
    WideTagTransport,
    barrier_record,
    collective_tag_base,
    endpoint_plan,
    op_parts,
    p2p_tag,
    p2p_tag_base,
    sandbox_endpoints,
    transport_prefix,
)

from prism.graph.io import read_graph
from prism.nccl_patches.vplan import device_lanes

from ..memtrack import untracked
from .base import CommEngine, CommRequest, GroupHandle, complete_op
from .completion import WaiterClaims
from .device_path import DeviceLanes
from .passthrough import PassthroughEngine

__all__ = ["LiveEngine", "live_result_path"]

log = logging.getLogger(__name__)

_REDUCING = (CommOp.ALL_REDUCE, CommOp.REDUCE, CommOp.REDUCE_SCATTER)
_PREFETCH_OPS = 4
"""Ops of a channel whose recorded data is loaded ahead of the one being submitted."""


def _no_python_dispatch():
    """prism's own torch ops on the script's thread skip the Python dispatch modes there (the CPU
    memory tracker's costs tens of µs per op on the 2-core host, and counts nothing inside
    ``untracked()`` anyway); torch versions without the guard run them through the modes."""
    guard = getattr(torch._C, "_DisableTorchDispatch", None)
    return guard() if guard is not None else contextlib.nullcontext()


def live_result_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank:05d}.live.json"


class _Channel:
    """One thread that runs a channel's ops in issue order."""

    def __init__(self, name: str, run) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.preloaded = False
        """Every record of the channel is loading or loaded already (no per-op prefetch)."""
        self._run = run
        self._lock = threading.Lock()
        self._ops = 0
        """Ops of the channel queued or running (``begin`` .. ``ended``)."""
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def begin(self) -> bool:
        """An op is queued; whether none was queued or running before it."""
        with self._lock:
            self._ops += 1
            return self._ops == 1

    def ended(self) -> None:
        with self._lock:
            self._ops -= 1

    def _loop(self) -> None:
        with profiled("live"):
            self._serve()

    def _serve(self) -> None:
        while (item := self.queue.get()) is not None:
            complete = self._run(*item)
            # The op's tensors are dropped before its waiter wakes: kept until the next op arrived,
            # or until this thread ran again after waking the script, a tensor the script has
            # freed (a pipeline stage's sent gradient) would count in the rank's allocator peak
            # or not depending on scheduling.
            del item
            complete()
            del complete


@dataclass(slots=True)
class _Posted:
    """A send/recv posted to the transport on the caller's thread, waiting for its channel thread."""

    works: list
    bufs: list[torch.Tensor]
    """The message of each part (sent, or received into)."""
    targets: list[torch.Tensor | None]
    """Where a received part is copied when it could not be received in place."""
    group_rank: int
    num_bytes: int
    checked_later: bool = False
    """A send whose divergence check was deferred (:meth:`LiveEngine._defer_send_check`)."""
    layout: _Layout | None = None
    """A collective run as a pair's exchange (:mod:`prism.nccl_patches.pair`): its parts. ``bufs``
    then holds each part's data, ``received`` what the vrank sent, and ``targets`` each part's
    recorded input to compare the data with at the wait (None where there is none, or where the
    comparison was deferred: :meth:`LiveEngine._defer_check`)."""
    received: list[torch.Tensor] | None = None


_DEFERRED_CHECKS = 64
"""Sends and pair exchanges whose divergence checks wait for one batch, run on a channel thread (their
records, loaded ahead, are held until then)."""


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class _Layout:
    """An op as pruned collectives (:func:`~prism.nccl_patches.vplan.op_parts`) from this rank's side."""

    parts: list
    outputs: list[torch.Tensor]
    root: int
    reduce_op: str
    what: str


@dataclass(frozen=True, slots=True)
class _Begun:
    """A part whose party has posted its first step; ``finish`` drives the rest (``start_sandbox_side``)."""

    finish: Callable[[], SandboxResult]
    diverged: bool
    """Its input differs from the record's (the party may find a divergence of its own later)."""


@dataclass(frozen=True, slots=True)
class _Early:
    """A one-part op begun on the script's thread at its issue (:meth:`LiveEngine._start_early`)."""

    layout: _Layout
    begun: _Begun


_EARLY_OPS = (CommOp.ALL_REDUCE, CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER)
_EARLY_MAX_BYTES = 1 << 20
"""Larger ops are begun on their channel thread: their input check and first step cost the script's
thread more than their start-up latency costs the op."""
_EARLY_START_ENV = "PRISM_LIVE_EARLY_START"


class LiveEngine(CommEngine):
    name = "live"

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        sandbox: Sequence[int] | None,
        transport_store: str,
        num_replayers: int = 1,
        recorded_dir: str | None = None,
        out_dir: str = ".",
        capture_dir: str | None = None,
        timeout_s: float = 300.0,
        device_path: str = "host",
        device_index: int = 0,
        graph_dir: str | None = None,
        connect_groups: Sequence[str] | None = None,
        eager_completion: bool = False,
        flag_divergence: bool = True,
    ) -> None:
        self.rank = rank
        self.sandbox = frozenset(range(world_size) if sandbox is None else sandbox)
        if rank not in self.sandbox:
            raise PrismError(f"live engine: rank {rank} is not in the sandbox set {sorted(self.sandbox)}")
        self.num_replayers = num_replayers
        self._device_path = device_path
        self.timeout_s = timeout_s
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self.out_dir = Path(out_dir)
        self.capture_dir = Path(capture_dir) if capture_dir else None
        self._store_addr = transport_store
        self._group_ranks: dict[str, int] = {}
        """This rank's group rank per group it belongs to (which input of a record is its own)."""
        self._recorded = RecordedStore(recorded_dir, prefetch_workers=1, select=self._own_part) \
            if recorded_dir else None
        self._lock = threading.Lock()
        self._channels: dict[tuple, _Channel] = {}
        self._claims = WaiterClaims(eager=eager_completion)
        """Per message channel, the posted send/recv that waits for its waiter."""
        self._flag_sends = flag_divergence and self._recorded is not None
        """Whether a send's bytes and a pair's input are compared with the recorded ones. That comparison
        only flags divergence (neither changes a value), and it cost a send ~37 µs of the script's
        thread on the 2-core host, with the background loads of the sends' records besides: off where
        nothing reads the flags (calibration slices) or another pass of the same emulation flags them
        (the timed pass before its memory pass: ``EmulateOptions.flag_divergence``)."""
        self._transports: dict[str, WideTagTransport] = {}
        self._transport_locks: dict[str, threading.Lock] = {}
        self._num_ops = 0
        self._num_early = 0
        """Ops begun on the script's thread (:meth:`_start_early`)."""
        self._diverged: list[dict] = []
        self._deferred: list[tuple[str, str, list[tuple[str, torch.dtype, int, bytes, torch.Tensor | None]], int]] = []
        """Ops whose divergence check waits for a batch: (op key, op, parts, the group rank whose input
        is compared); each part (its record's key, dtype, numel, bytes, its recorded input or None:
        looked up then)."""
        self._deferred_lock = threading.Lock()
        self._traffic_bytes = 0
        self._first_done_unix_s: float | None = None
        self._capture_meta: list[dict] = []
        self._capture_tensors: dict[str, torch.Tensor] = {}
        self._lanes: DeviceLanes | None = None
        self._real: PassthroughEngine | None = None
        if device_path in DEVICE_DATA_PATHS:
            if not graph_dir:
                raise PrismError("live engine: the nccl device path needs the graph (graph_dir)")
            graph = read_graph(graph_dir)
            members = {gid: g.ranks for gid, g in graph.groups.items()}
            lanes = device_lanes(graph.nodes.get(rank, ()), rank, members, self.sandbox, num_replayers)
            del graph
            device = torch.device("cuda", device_index) if device_path != "lanes" else torch.device("cpu")
            self._lanes = DeviceLanes(rank=rank, device=device, lanes=lanes,
                                      store_factory=self._transport_store, timeout_s=timeout_s)
            if device_path != "lanes":
                # Groups of sandbox ranks only run the real backend among them (no vrank takes
                # part): their ops are what the real job's are, on the real links.
                self._real = PassthroughEngine(cuda_backend="nccl", timeout_s=timeout_s,
                                               eager_completion=eager_completion)
        elif device_path == "host" and self.capture_dir is None:
            # The same for a pair of sandbox ranks on the host path (a tp pair inside a calibration
            # slice): the job's own gloo op, not prism's ring steps in Python, whose per-step cost the
            # slices would measure as the pair's transfer (tp-sleep: 6.0 ms of comm per step in the
            # timed graph against 2.3 real, session 28). Pairs only: two operands reduce to the same
            # bits in either order, so the values stay the capture's; a larger group's reduction
            # order is prism's ring's, the one the recorded data holds.
            self._real = PassthroughEngine(cuda_backend="gloo", timeout_s=timeout_s, eager_completion=eager_completion)
        self._real_groups: set[str] = set()
        self._pairs = pair.enabled() and self._lanes is None
        """A group of two with one vrank runs its all-reduce, all-gather and reduce-scatter as one
        exchange posted at the issue (:mod:`prism.nccl_patches.pair`); the replayer decides alike."""
        self._num_pair = 0
        self._early_start = os.environ.get(_EARLY_START_ENV) == "1"
        """Small collectives begin on the script's thread (:meth:`_start_early`); off by default until
        measured on 16 cores."""
        self._connect_groups = frozenset(connect_groups or ())
        self._lazy: list[str] = []
        """Groups whose transport connected inside an op rather than at the group's creation."""

    # ------------------------------------------------------------------------------ plumbing

    def _transport_store(self) -> dist.Store:
        # One client per transport: a TCPStore client serializes its requests, so a rendezvous
        # waiting for a late peer would hold up the rendezvous of every other group.
        host, _, port = self._store_addr.rpartition(":")
        return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=self.timeout_s))

    def _transport(self, group: GroupHandle, *, at_creation: bool = False) -> WideTagTransport:
        gid = group.group_id
        with self._lock:
            lock = self._transport_locks.setdefault(gid, threading.Lock())
        with lock:
            if gid not in self._transports:
                if self._lanes is None:
                    plan = endpoint_plan(gid, group.ranks, self.sandbox, self.num_replayers)
                    endpoint_of, num_endpoints = plan.endpoint_of, plan.num_endpoints
                else:
                    # Delegated paths: the replayer serves lanes and joins no group transport; what
                    # is left here is messages between two sandbox ranks of a group that has
                    # vranks, over a transport of the group's sandbox members.
                    endpoint_of = sandbox_endpoints(group.ranks, self.sandbox)
                    num_endpoints = len(endpoint_of)
                log.debug("rank %d: transport of group %s, %d endpoints", self.rank, gid, num_endpoints)
                self._transports[gid] = WideTagTransport.connect(
                    self._transport_store(), endpoint_of[group.group_rank], num_endpoints,
                    endpoint_of, timeout_s=self.timeout_s, prefix=transport_prefix(gid),
                )
                if not at_creation:
                    self._lazy.append(gid)
            return self._transports[gid]

    @staticmethod
    def _ends(req: CommRequest) -> tuple[int, int]:
        me = req.group.global_rank
        return (me, req.peer) if req.op is CommOp.SEND else (req.peer, me)

    def _own_part(self, key: str, entry: dict) -> Callable[[str], bool] | None:
        """What this rank reads of a record: its own input (all a ring, chain, direct, P2P or pair
        record is needed for here: the divergence flag, and a pair's size check; a pair's result is
        reduced from what the vrank sent); a tree all-reduce whole (its root selects recorded values).
        A record also holds the neighbor vranks' entry partials and the outputs, which the replayer
        reads: read here, they would triple the rank's loads and the memory they take beside the
        script."""
        gid = key.split("/", 2)[1]
        group_rank = self._group_ranks.get(gid)
        if group_rank is None or entry.get("algo") == Algo.TREE_ALL_REDUCE.value:
            return None
        return f"in.{group_rank}".__eq__

    def create_group(self, group: GroupHandle, store: object) -> None:
        self._group_ranks[group.group_id] = group.group_rank
        if self._real is not None and self._runs_real(group):
            self._real.create_group(group, store)
            self._real_groups.add(group.group_id)
            return
        self._load_records_of(group)
        if self._lanes is None:
            if group.size > 1 and group.group_id in self._connect_groups:
                with untracked():
                    self._transport(group, at_creation=True)
            return
        if self._lanes.has_vranks(group.group_id):
            self._lanes.open_group(group.group_id)

    def _load_records_of(self, group: GroupHandle) -> None:
        """The records this rank reads of a group's ops (its collectives', and its own sends' where
        they are compared), loaded when the group is created, before the script's steps, as the
        replayer loads its own before its first op: loaded in the background from a channel's first
        op, they took the CPU from the first measured steps (docs/emulate.md, session 48)."""
        if self._recorded is None or self._lanes is not None or group.size < 2:
            return  # (on a device path the lanes read what they need)
        gid = group.group_id
        keys = self._recorded.keys_under(f"c/{gid}/")
        if self._flag_sends:
            keys += self._recorded.keys_under(f"p/{gid}/{self.rank}-")
        if keys and self._recorded.preload(keys):
            self._recorded.wait_loaded(self.timeout_s)

    def _runs_real(self, group: GroupHandle) -> bool:
        """Whether the group's ops run on the real backend: every member a sandbox rank; on a device
        path any size (1 included: a mesh dimension of size 1 is a one-rank NCCL communicator in
        the real job, its all-reduce a device copy at most, not a trip through host memory), on the
        host path pairs only (see ``__init__``)."""
        if not all(r in self.sandbox for r in group.ranks):
            return False
        return self._lanes is not None or group.size == 2

    def submit(self, request: CommRequest) -> torch.futures.Future:
        if request.group.group_id in self._real_groups:
            future = self._real.submit(request)
            self._first_done()
            return future
        if self._lanes is not None:
            if (lane := self._lanes.lane_for(request)) is not None:
                future = self._lanes.submit(request, lane)
                self._first_done()
                return future
        p2p = request.op in (CommOp.SEND, CommOp.RECV)
        gid = request.group.group_id
        if p2p:
            src, dst = self._ends(request)
            channel = ("p", gid, src, dst)
        else:
            channel = ("c", gid)
        snapshot = None
        if self.capture_dir is not None:
            with untracked():  # prism's own buffers on the script's thread, like a backend's
                snapshot = [t.detach().clone() for t in request.inputs]
        ch = self._channels.get(channel) or self._new_channel(channel, request)
        if self._recorded is not None and not ch.preloaded and request.op is not CommOp.RECV:
            self._recorded.prefetch(self._key(request, 0, seq=s)
                                    for s in range(request.seq, request.seq + 1 + _PREFETCH_OPS))
        if not p2p and self._runs_as_pair(request) and not any(t.is_cuda for t in (*request.inputs, *request.outputs)):
            transport = self._transports.get(gid)  # connected at the group's creation; else on its channel
            if transport is not None:
                try:
                    with untracked(), _no_python_dispatch():
                        posted = self._post_pair(request, self._layout(request, request.inputs, request.outputs),
                                                 transport)
                except BaseException as e:  # noqa: BLE001 - delivered to the waiter
                    failed = torch.futures.Future()
                    failed.set_exception(e)
                    return failed
                return self._claims.future(channel, (request, snapshot, posted, ch), self._finish_here, self._to_channel)
        transport = self._transports.get(gid) if p2p else None
        if transport is None:  # collectives, and a group's first messages (its transport connects there)
            if any(t.is_cuda for t in (*request.inputs, *request.outputs)):
                # The channel thread reads the inputs on its own stream: it first waits for what the
                # caller's stream (e.g. FSDP's all-gather or reduce-scatter stream) has queued.
                ready = torch.cuda.Event()
                ready.record()
                request.extra["inputs_ready"] = ready
            future: torch.futures.Future = torch.futures.Future()
            idle = ch.begin()
            early = None
            if idle and self._early_start and not p2p:
                try:
                    early = self._start_early(request)
                except BaseException as e:  # noqa: BLE001 - delivered to the waiter, as the channel thread would
                    ch.ended()
                    future.set_exception(e)
                    return future
            if early is not None:
                with self._lock:
                    self._num_early += 1
            ch.queue.put((self._run, request, future, snapshot, ch, early))
            return future
        try:
            with untracked():
                posted = self._post_p2p(request, transport)
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            failed: torch.futures.Future = torch.futures.Future()
            failed.set_exception(e)
            return failed
        if request.op is CommOp.SEND and self._flag_sends:
            self._defer_send_check(request, posted, ch)
        # Posted; completed by the thread that waits for it, as record's passthrough does (the
        # channel thread only when something else asks or the channel's next message comes first).
        return self._claims.future(channel, (request, snapshot, posted, ch), self._finish_here, self._to_channel)

    def _finish_here(self, future: torch.futures.Future, req: CommRequest, snapshot, posted: _Posted,
                     _ch: _Channel) -> Callable[[], None]:
        if posted.layout is not None:
            return self._finish_pair(req, future, snapshot, posted)
        return self._finish_p2p(req, future, snapshot, posted)

    def _to_channel(self, future: torch.futures.Future, req: CommRequest, snapshot, posted: _Posted,
                    ch: _Channel) -> None:
        ch.queue.put((self._finish_pair if posted.layout is not None else self._finish_p2p, req, future, snapshot, posted))

    def _new_channel(self, channel: tuple, request: CommRequest) -> _Channel:
        with self._lock:
            ch = self._channels.get(channel)
            if ch is not None:
                return ch
            ch = self._channels[channel] = _Channel(f"prism-live-{'-'.join(map(str, channel))}", self._call)
        if self._recorded is None or request.op is CommOp.RECV or (request.op is CommOp.SEND and not self._flag_sends):
            ch.preloaded = True  # a receiver needs no record, nor a send that is not compared with its own
        else:
            keys = self._recorded.keys_under(self._key(request, 0).rsplit("/", 2)[0] + "/")
            ch.preloaded = bool(keys) and self._recorded.preload(keys) == len(keys)
        return ch

    @staticmethod
    def _call(fn, *args) -> Callable[[], None]:
        return fn(*args)

    def _run(self, req: CommRequest, future: torch.futures.Future, snapshot, ch: _Channel,
             early: _Early | None = None) -> Callable[[], None]:
        """Runs the op; returns what completes its future (the channel calls it once it has
        dropped the op)."""
        try:
            with torch.no_grad():
                self._execute(req, snapshot, early)
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            log.debug("rank %d: %s %s:%d failed", self.rank, req.op.value, req.group.group_id, req.seq, exc_info=True)
            return functools.partial(future.set_exception, e)
        finally:
            ch.ended()
        return functools.partial(self._complete, future, req.outputs, req.extra)

    def _first_done(self) -> None:
        if self._first_done_unix_s is None:
            with self._lock:
                if self._first_done_unix_s is None:
                    self._first_done_unix_s = time.time()

    def _complete(self, future: torch.futures.Future, outputs: list[torch.Tensor], extra: dict) -> None:
        self._first_done()
        complete_op(future, outputs, extra)

    # ------------------------------------------------------------------ send/recv posted at once

    def _post_p2p(self, req: CommRequest, transport: WideTagTransport) -> _Posted:
        """Post the message(s) of a send/recv now (the parts :func:`op_parts` would give: one P2P
        step per tensor, the same tags). The script's tensors go to gloo as they are, as c10d
        hands them to its backend: no torch op runs on the caller's thread (on CPU the memory
        tracker's dispatch mode makes each one cost tens of µs there; the real run pays none)."""
        g = req.group
        n = g.size
        src, dst = self._ends(req)
        s, d = g.to_group_rank(src), g.to_group_rank(dst)
        send = req.op is CommOp.SEND
        works, bufs, targets, num_bytes = [], [], [], 0
        for i, t in enumerate(req.inputs if send else req.outputs):
            tag = p2p_tag(req.seq, i, n, s, d)
            target = None
            if t.is_contiguous():
                buf = t
            elif send:
                buf = t.contiguous()
            else:
                buf, target = torch.empty(t.shape, dtype=t.dtype, device=t.device), t
            works.append(transport.send(buf, s, d, tag) if send else transport.recv(buf, s, d, tag))
            bufs.append(buf)
            targets.append(target)
            num_bytes += buf.numel() * buf.element_size()
        return _Posted(works, bufs, targets, s if send else d, num_bytes)

    def _finish_p2p(self, req: CommRequest, future: torch.futures.Future, snapshot,
                    posted: _Posted) -> Callable[[], None]:
        try:
            # The divergence flag of a send: while the message is in flight (the script may not
            # touch the tensor before its work completes), so it neither delays the message nor,
            # after the transfer, the script's wait. The comparison records no autograd history, so
            # no ``torch.no_grad()`` around it: on pp_sleep_noopt the two it had were a third of the
            # GIL time of a message's wait (py-spy, session 36; docs/emulate.md). Untracked: it runs
            # on the script's thread when the script waits, and a recorded value it touches (read
            # from disk, outside the dispatcher) would count in the rank's peak from then on.
            diverged = False
            if req.op is CommOp.SEND and self._flag_sends and not posted.checked_later:
                with untracked():
                    for i, buf in enumerate(posted.bufs):
                        rec = self._recorded.get(self._key(req, i))
                        mine = rec.inputs.get(posted.group_rank) if rec is not None else None
                        diverged |= mine is not None and (not matches_record(buf, mine)
                                                          or not same_bits(buf, mine))
            for work in posted.works:
                if not work.wait(self._timeout):
                    raise PrismError(f"rank {self.rank}: {req.op.value} on group {req.group.group_id} "
                                     f"seq {req.seq} timed out after {self.timeout_s}s")
            for buf, target in zip(posted.bufs, posted.targets, strict=True):
                if target is not None:
                    with torch.no_grad():  # a pipeline's recv buffer may be a leaf that requires grad
                        target.copy_(buf)
            self._done(req, diverged, snapshot, posted.num_bytes)
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            log.debug("rank %d: %s %s:%d failed", self.rank, req.op.value, req.group.group_id, req.seq, exc_info=True)
            return functools.partial(future.set_exception, e)
        return functools.partial(self._complete, future, req.outputs, req.extra)

    def _defer_send_check(self, req: CommRequest, posted: _Posted, ch: _Channel) -> None:
        """Keep a copy of a small send's bytes (no torch call) and compare them with the recorded
        message later, in batches on a channel thread, instead of in the script's wait for the
        send: there the check (the record's lookup and the comparison, run cold after the script's
        compute) was a third of a send wait on 2 cores and the largest part of its excess over the
        real run's (session 38; docs/emulate.md, "A send's wait on the sandbox path"). Larger
        messages are checked at the wait as before."""
        posted.checked_later = self._defer_check(req, posted.bufs, None, posted.group_rank, ch)

    def _defer_check(self, req: CommRequest, parts: Sequence[torch.Tensor],
                     recorded: Sequence[torch.Tensor | None] | None, group_rank: int, ch: _Channel | None = None) -> bool:
        """Queue the comparison of an op's small inputs (each part's flat data) with their
        recorded inputs for a batch on a channel thread (``ch``, else the op's own channel's):
        ``recorded`` holds each part's (None: the part has none, nothing to compare), or is None
        for the batch to look them up. False, and nothing queued, where an input is not small or not
        readable as its bytes (:func:`host_bytes`)."""
        checks = []
        for i, buf in enumerate(parts):
            mine = recorded[i] if recorded is not None else None
            if recorded is not None and mine is None:
                continue
            data = host_bytes(buf)
            if data is None:
                return False
            checks.append((self._key(req, i), buf.dtype, buf.numel(), data, mine))
        if not checks:
            return False
        with self._deferred_lock:
            self._deferred.append((checks[0][0].rsplit("/", 1)[0], req.op.value, checks, group_rank))
            if len(self._deferred) < _DEFERRED_CHECKS:
                return True
            batch, self._deferred = self._deferred, []
        ch = ch or self._channels[("c", req.group.group_id)]
        ch.queue.put((self._check_deferred, batch))
        return True

    def _check_deferred(self, batch) -> Callable[[], None]:
        """Flag the ops of ``batch`` whose bytes differ from the recorded ones; returns a no-op
        (a channel thread's item returns what completes it)."""
        diverged = []
        with untracked():  # recorded values are read outside the dispatcher
            for key, op, parts, group_rank in batch:
                for part_key, dtype, numel, data, mine in parts:
                    if mine is None:
                        rec = self._recorded.get(part_key)
                        mine = rec.inputs.get(group_rank) if rec is not None else None
                    if mine is not None and not same_bits_as(data, dtype, numel, mine):
                        diverged.append({"key": key, "op": op})
                        break
        with self._lock:
            self._diverged.extend(diverged)
        return _nothing

    # ------------------------------------------------------------------------------ a pair

    def _runs_as_pair(self, req: CommRequest) -> bool:
        return self._pairs and pair.runs_as_pair(req.op, req.reduce_op, req.group.ranks, self.sandbox)

    def _post_pair(self, req: CommRequest, layout: _Layout, transport: WideTagTransport) -> _Posted:
        """Post each part's send to the vrank and its receive from it, on the calling thread (gloo
        moves them in its own threads, as it runs a real pair's collective). A recorded input of
        another size or dtype stops the op first, naming it (:meth:`_unusable_record`), as on the
        ring. Whether the input is the recorded one only sets the divergence flag (the result is
        reduced from what the vrank sent either way: :meth:`_pair_outputs`), so a small input's
        comparison waits for a batch on a channel thread (:meth:`_defer_check`), as a send's does."""
        me = req.group.group_rank
        other = 1 - me
        recorded: list[torch.Tensor | None] = []
        for i, part in enumerate(layout.parts):
            rec = self._record_of(req, i)
            mine = rec.inputs.get(me) if rec is not None else None
            if mine is not None and not matches_record(part.data, mine):
                self._unusable_record(layout.what, req.group, part.data, mine)
            recorded.append(mine)
        if not self._flag_sends or self._defer_check(req, [part.data for part in layout.parts], recorded, me):
            recorded = [None] * len(recorded)
        works, data, received, num_bytes = [], [], [], 0
        for i, part in enumerate(layout.parts):
            sent = pair.sandbox_sends(req.op, part.data, me)
            if not sent.is_contiguous():
                sent = sent.contiguous()
            buf = torch.empty(pair.sandbox_receive_numel(req.op, part.data.numel(), me), dtype=part.data.dtype)
            works.append(transport.send(sent, me, other, pair.pair_tag(req.seq, i, me)))
            works.append(transport.recv(buf, other, me, pair.pair_tag(req.seq, i, other)))
            data.append(part.data)
            received.append(buf)
            num_bytes += sent.numel() * sent.element_size()
        with self._lock:
            self._num_pair += 1
        return _Posted(works, data, recorded, me, num_bytes, layout=layout, received=received)

    def _pair_outputs(self, req: CommRequest, posted: _Posted) -> bool:
        """Wait for a pair's exchange and write its results to the op's outputs: the reduction of the
        rank's input and what the vrank sent, in prism's ring order (for the recorded input, the
        recorded output bit for bit). Returns whether an input compared here differs from its record."""
        layout = posted.layout
        for work in posted.works:
            if not work.wait(self._timeout):
                raise PrismError(f"rank {self.rank}: {req.op.value} on group {req.group.group_id} "
                                 f"seq {req.seq} timed out after {self.timeout_s}s")
        me = req.group.group_rank
        with torch.no_grad(), untracked(), _no_python_dispatch():
            # before the results: an all-reduce writes its result over its input
            diverged = any(mine is not None and not same_bits(data, mine)
                           for data, mine in zip(posted.bufs, posted.targets, strict=True))
            outs = [pair.pair_result(req.op, layout.reduce_op, me, data, received)
                    for data, received in zip(posted.bufs, posted.received, strict=True)]
            _write_outputs(req, outs, me, layout.root)
        return diverged

    def _finish_pair(self, req: CommRequest, future: torch.futures.Future, snapshot,
                     posted: _Posted) -> Callable[[], None]:
        try:
            diverged = self._pair_outputs(req, posted)
            self._done(req, diverged, snapshot, posted.num_bytes)
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            log.debug("rank %d: %s %s:%d failed", self.rank, req.op.value, req.group.group_id, req.seq, exc_info=True)
            return functools.partial(future.set_exception, e)
        return functools.partial(self._complete, future, req.outputs, req.extra)

    # ------------------------------------------------------------------------------ one op

    def _key(self, req: CommRequest, part: int, *, seq: int | None = None) -> str:
        seq = req.seq if seq is None else seq
        if req.op in (CommOp.SEND, CommOp.RECV):
            src, dst = self._ends(req)
            return p2p_key(req.group.group_id, src, dst, seq, part)
        return collective_key(req.group.group_id, seq, part)

    def _layout(self, req: CommRequest, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> _Layout:
        g = req.group
        n, me = g.size, g.group_rank
        what = f"rank {self.rank}: {req.op.value} on group {g.group_id} seq {req.seq}"
        root, peer = (g.to_group_rank(req.root) if req.root >= 0 else 0), -1
        if req.op in (CommOp.SEND, CommOp.RECV):
            src, dst = self._ends(req)
            root, peer = g.to_group_rank(src), g.to_group_rank(dst)
        parts = op_parts(req.op, inputs, n=n, group_rank=me, root=root, peer=peer, flat=req.flat,
                         in_splits=req.in_splits, out_splits=req.out_splits, outputs=outputs, what=what)
        reduce_op = "sum" if req.op is CommOp.BARRIER else (req.reduce_op if req.op in _REDUCING else "")
        return _Layout(parts, outputs, root, reduce_op, what)

    def _party_kw(self, req: CommRequest, layout: _Layout, part) -> dict:
        a2a = part.in_splits is not None
        return dict(group_size=req.group.size, reduce_op=layout.reduce_op, root=part.root, peer=part.peer,
                    in_splits=part.in_splits if a2a else None, out_splits=part.out_splits if a2a else None)

    def _begin_part(self, req: CommRequest, layout: _Layout, i: int, transport: WideTagTransport,
                    rec: RecordedCollective | None) -> _Begun:
        """Check part ``i``'s input against its record (``rec``), build its party and post the party's
        first step (``start_sandbox_side``); the rest is driven by the returned ``finish``."""
        g, part = req.group, layout.parts[i]
        n, me = g.size, g.group_rank
        diverged = False
        if rec is not None and me in rec.inputs and not matches_record(part.data.reshape(-1), rec.inputs[me]):
            rec = self._unusable_record(layout.what, g, part.data, rec.inputs[me])
            diverged = True
        is_p2p = req.op in (CommOp.SEND, CommOp.RECV)
        tag_base = p2p_tag_base(req.seq, i, n, part.root) if is_p2p else collective_tag_base(req.seq, i, n)
        # The record names the algorithm the collector chose (NCCL_ALGO=Tree: a tree all-reduce).
        algo = rec.algo if rec is not None and req.op is CommOp.ALL_REDUCE else part.algo
        finish = start_sandbox_side(transport, algo, me, part.data, recorded=rec, tag_base=tag_base,
                                    out=_result_buffer(req, i, part.data, layout.outputs), timeout_s=self.timeout_s,
                                    **self._party_kw(req, layout, part))
        return _Begun(finish, diverged)

    def _record_of(self, req: CommRequest, i: int) -> RecordedCollective | None:
        g = req.group
        if req.op is CommOp.BARRIER:
            return barrier_record(g.size, [gr for gr, r in enumerate(g.ranks) if r in self.sandbox])
        if req.op is CommOp.RECV:
            return None  # a receiver has no recorded input: nothing to compare
        return self._recorded.get(self._key(req, i)) if self._recorded else None

    def _execute(self, req: CommRequest, snapshot, early: _Early | None = None) -> None:
        g = req.group
        n, me = g.size, g.group_rank
        inputs, outputs = req.inputs, req.outputs
        if early is not None:
            layout = early.layout
        else:
            if any(t.is_cuda for t in (*inputs, *outputs)):
                # As ProcessGroupGloo does with CUDA tensors (and the transports are gloo): the data is
                # copied to the host, the algorithm runs there, the results are copied back. The
                # collective holds no device memory of its own, like NCCL's buffers, so the rank's
                # allocator peak is the real run's.
                if "inputs_ready" in req.extra:
                    req.extra.pop("inputs_ready").synchronize()
                inputs = [t.detach().cpu() for t in inputs]
                outputs = [torch.empty(t.shape, dtype=t.dtype) for t in outputs]
            layout = self._layout(req, inputs, outputs)
        outs: list[torch.Tensor | None] = []
        diverged = False
        num_bytes = 0
        transport = self._transport(g) if n > 1 else None
        if early is None and self._runs_as_pair(req):
            posted = self._post_pair(req, layout, transport)
            self._done(req, self._pair_outputs(req, posted), snapshot, posted.num_bytes)
            return
        for i, part in enumerate(layout.parts):
            if transport is None:
                outs.append(SandboxParty(part.algo, me, part.data, **self._party_kw(req, layout, part)).output())
                continue
            begun = early.begun if early is not None else self._begin_part(req, layout, i, transport, self._record_of(req, i))
            res = begun.finish()
            outs.append(res.output)
            diverged |= begun.diverged or res.diverged
            num_bytes += sum(t.num_bytes for t in res.traffic.values())
        _write_outputs(req, outs, me, layout.root)
        self._done(req, diverged, snapshot, num_bytes)

    def _start_early(self, req: CommRequest) -> _Early | None:
        """Post a small collective's first ring step on the script's thread at its issue, as gloo's own
        thread would start it at once (``PRISM_LIVE_EARLY_START=1``; docs/emulate.md, "A 2-rank
        collective with a vrank partner"). Otherwise the channel thread starts it, once it has the GIL:
        in an emulation the script's thread runs Python from its issue to its wait (DTensor, the
        functional collectives), and a TP all-reduce with a vrank partner started 0.7 ms after its
        issue on 16 cores. Called only when the channel is idle (no earlier op of the group queued or
        running); only for one small CPU part whose record is loaded already (nothing blocks the
        script); else None, and the channel thread runs the whole op."""
        g = req.group
        if req.op not in _EARLY_OPS or g.size < 2:
            return None
        transport = self._transports.get(g.group_id)
        tensors = (*req.inputs, *req.outputs)
        if transport is None or any(t.is_cuda for t in tensors) or sum(t.numel() * t.element_size() for t in req.inputs) > _EARLY_MAX_BYTES:
            return None
        key = self._key(req, 0)
        if self._recorded is not None and not self._recorded.loaded(key):
            return None
        with torch.no_grad(), untracked():
            layout = self._layout(req, req.inputs, req.outputs)
            if len(layout.parts) != 1:
                return None
            begun = self._begin_part(req, layout, 0, transport, self._record_of(req, 0))
        return _Early(layout, begun)

    def _unusable_record(self, what: str, group: GroupHandle, data: torch.Tensor, recorded: torch.Tensor) -> None:
        """A recorded input of another size or dtype than the script's: the run that recorded the data
        took another path (a checkpoint it resumed from, other arguments or data). With every member
        of the group real (three or more: a pair runs on gloo and reads no record) the op runs
        without the record, as a divergence; virtual members would replay values of the wrong size,
        so the emulation stops, naming the op."""
        problem = recorded_on_another_path(what, describe(data.dtype, data.numel()),
                                           describe(recorded.dtype, recorded.numel()))
        if any(r not in self.sandbox for r in group.ranks):
            raise MismatchError(f"{problem}; its virtual peers cannot replay this op")
        log.warning("%s; every member of the group runs for real: the op runs without the record (diverged)", problem)
        return None

    def _done(self, req: CommRequest, diverged: bool, snapshot, num_bytes: int) -> None:
        with self._lock:
            self._num_ops += 1
            self._traffic_bytes += num_bytes
            if diverged:
                self._diverged.append({"key": self._key(req, 0).rsplit("/", 1)[0], "op": req.op.value})
            if self.capture_dir is not None:
                self._capture(req, snapshot)

    # ------------------------------------------------------------------------------ capture

    def _capture(self, req: CommRequest, snapshot: list[torch.Tensor]) -> None:
        key = self._key(req, 0).rsplit("/", 1)[0]
        g = req.group
        meta = {"key": key, "op": req.op.value, "group_id": g.group_id, "seq": req.seq,
                "group_ranks": list(g.ranks), "root": req.root if req.op not in (CommOp.SEND, CommOp.RECV) else -1,
                "flat": req.flat, "coalesced": req.coalesced, "reduce_op": req.reduce_op,
                "in_splits": list(req.in_splits), "out_splits": list(req.out_splits),
                "num_inputs": len(snapshot), "num_outputs": len(req.outputs)}
        if req.op in (CommOp.SEND, CommOp.RECV):
            meta["src"], meta["dst"] = self._ends(req)
        self._capture_meta.append(meta)
        for i, t in enumerate(snapshot):
            self._capture_tensors[f"{key}/in/{i}"] = t.contiguous()
        for i, t in enumerate(req.outputs):
            self._capture_tensors[f"{key}/out/{i}"] = t.detach().clone().contiguous()

    # ------------------------------------------------------------------------------- finish

    def shutdown(self) -> None:
        self._claims.hand_over_all()
        with self._lock:
            channels = list(self._channels.values())
        for ch in channels:
            ch.queue.put(None)
        for ch in channels:
            ch.thread.join(timeout=self.timeout_s)
        with self._deferred_lock:
            batch, self._deferred = self._deferred, []
        self._check_deferred(batch)
        from ..shim import current_sandbox  # the recorder holds the losses

        sandbox = current_sandbox()
        lanes = self._lanes
        lane_kinds = lanes.lane_kinds() if lanes is not None else {}
        if lanes is not None:
            lanes.close()
        if self._real is not None:
            self._real.shutdown()
        result = {
            "rank": self.rank,
            "device_path": self._device_path,
            "num_lanes": lanes.num_lanes if lanes is not None else 0,
            "lane_kinds": lane_kinds,
            "num_ops": self._num_ops + (lanes.num_ops if lanes is not None else 0),
            "early_starts": self._num_early,
            "flagged_divergence": self._flag_sends,
            "pair_exchanges": self._num_pair,
            "diverged_ops": self._diverged,
            "num_transports": len(self._transports),
            "num_connections": sum(t.pg.size() - 1 for t in self._transports.values()),
            "lazy_transports": self._lazy,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "traffic_bytes": self._traffic_bytes + (lanes.traffic_bytes if lanes is not None else 0),
            "first_op_done_unix_s": self._first_done_unix_s,
            "losses": list(sandbox.recorder.losses) if sandbox else [],
            "step_times_ns": list(sandbox.recorder.step_times_ns) if sandbox else [],
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(live_result_path(self.out_dir, self.rank), json.dumps(result, indent=1))
        if self.capture_dir is not None:
            write_capture(self.capture_dir, self.rank, self._capture_tensors, self._capture_meta)
        if self._recorded is not None:
            self._recorded.close()
        for t in self._transports.values():
            t.close()


def _result_buffer(req: CommRequest, part: int, data: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor | None:
    """Where part ``part``'s ring builds its result: the op's own output, as the real backend
    writes it (an all-reduce in place in its input; a flat all-gather in its output), so no result
    is gathered and copied after the op; None where the result is copied out after."""
    if req.op is CommOp.ALL_REDUCE:  # data is the input's flat view, or its contiguous copy
        return data
    if req.op is CommOp.ALL_GATHER and req.flat and outputs[part].is_contiguous() and outputs[part].dtype == data.dtype:
        return outputs[part].detach().reshape(-1)
    return None


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if src.data_ptr() == dst.data_ptr() and src.numel() == dst.numel() and dst.is_contiguous() \
            and src.device == dst.device and src.dtype == dst.dtype:
        return  # the ring built the result in place
    dst.copy_(src.reshape(dst.shape))


def _write_outputs(req: CommRequest, outs: list[torch.Tensor | None], me: int, root: int) -> None:
    """Copy the flat results of the parts into the script's output tensors."""
    op, n = req.op, req.group.size
    if op in (CommOp.ALL_REDUCE, CommOp.RECV) or (op is CommOp.REDUCE and me == root):
        for t, o in zip(req.outputs, outs, strict=True):
            _copy(t, o)
    elif op is CommOp.BROADCAST:
        if me != root:
            for t, o in zip(req.outputs, outs, strict=True):
                _copy(t, o)
    elif op is CommOp.ALL_GATHER and req.flat:
        for t, o in zip(req.outputs, outs, strict=True):
            _copy(t, o)
    elif op is CommOp.ALL_GATHER or (op is CommOp.GATHER and me == root):
        for i, o in enumerate(outs):
            for j, piece in enumerate(o.chunk(n) if o.numel() else [o] * n):
                _copy(req.outputs[i * n + j], piece)
    elif op is CommOp.REDUCE_SCATTER:
        for t, o in zip(req.outputs, outs, strict=True):
            _copy(t, o)
    elif op is CommOp.ALL_TO_ALL:
        if req.flat:
            _copy(req.outputs[0], outs[0])
        else:
            pieces = outs[0].split([t.numel() for t in req.outputs])
            for t, piece in zip(req.outputs, pieces, strict=True):
                _copy(t, piece)
    elif op is CommOp.SCATTER:
        m = req.outputs[0].numel()
        _copy(req.outputs[0], outs[0][me * m : (me + 1) * m])
