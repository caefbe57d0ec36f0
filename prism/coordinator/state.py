"""The run state of one collection: ranks, slots, pending comm instances; the RPC handler.

Every RPC of a rank worker lands here (through :class:`prism.rpc.CoordinatorServer`):

* ``submit``: the inputs of one comm op. Collectives are matched by ``(group_id, seq)``; when
  every member has arrived the CPU executor computes all outputs. A send is buffered and matched
  with its recv by ``(src, dst, group_id, seq)``.
* ``fetch``: the rank wants the op's outputs. If they are ready it keeps its slot; otherwise it
  releases the slot (its device context is swapped out) and waits until the outputs are ready
  *and* the scheduler grants it a slot again (swapped back in first).
* ``finish``: the rank's program returned; its slot is free.

With rules (``comm_inputs.source: rules``, :mod:`.rules`) an op is decided at submit from this
rank's own inputs unless a rule says ``exact``; with DP templates only the template ranks run and
an op whose members do not all run is decided by the rules as well (``exact`` falls back to the
filler there).

One lock guards everything; executor and payload writes run under it, which keeps the matching
simple and is cheap next to the ranks' own compute.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from prism.core.errors import MismatchError, PrismError
from prism.core.ranks import format_rank_ranges
from prism.rpc import CommHeader, FetchError

from .cuda_checkpoint import ContextSwitcher
from .executor import Arrival, execute, execute_p2p
from .payloads import PayloadPolicy, PayloadStore, op_key
from .pruned_data import PrunedDataRecorder
from .recorded import RecordedValues
from .report import describe_op, format_pending_report
from .rules import EXACT, RuleSet
from .scheduler import Candidate, pick_next, pending_counts

__all__ = ["RankStatus", "RunState", "CollectStats"]

log = logging.getLogger(__name__)


class RankStatus(enum.Enum):
    NOT_STARTED = "not started"
    ACTIVE = "active"
    BLOCKED = "blocked"
    READY = "ready"
    EXITING = "exiting"
    FINISHED = "finished"


@dataclass
class _Op:
    header: CommHeader
    outputs: list[torch.Tensor] | None = None
    error: str = ""

    @property
    def done(self) -> bool:
        return self.outputs is not None or bool(self.error)


@dataclass
class _Rank:
    rank: int
    status: RankStatus = RankStatus.NOT_STARTED
    slot: int = -1
    pid: int = 0
    waiting_op: int = -1
    candidate_since: int = 0
    swapped_out: bool = False
    ops: dict[int, _Op] = field(default_factory=dict)
    last_op: CommHeader | None = None
    num_grants: int = 0


@dataclass
class _Instance:
    members: tuple[int, ...]
    arrivals: dict[int, Arrival] = field(default_factory=dict)
    op_index: dict[int, int] = field(default_factory=dict)

    def missing(self) -> list[int]:
        return [r for r in self.members if r not in self.arrivals]


@dataclass
class CollectStats:
    num_collectives: int = 0
    num_p2p: int = 0
    num_grants: int = 0
    num_context_switches: int = 0
    """Slot releases by a rank that had to wait (each one a swap-out and, later, a swap-in)."""
    num_kept_slot: int = 0
    """Comm ops whose outputs were ready at fetch time, so the rank kept its slot."""
    num_by_rule: int = 0
    """Comm ops (per rank) whose outputs a rule or the filler decided."""
    num_waited_in_place: int = 0
    """Comm ops a rank waited for holding its slot, because no other rank wanted one (no swap)."""


class RunState:
    """Implements :class:`prism.rpc.CoordinatorHandler` for one run."""

    def __init__(self, world_size: int, num_slots: int, *, switcher: ContextSwitcher,
                 payloads: PayloadStore | None = None, policy: PayloadPolicy | None = None,
                 starvation_grants: int | None = None, recorded: RecordedValues | None = None,
                 pruned: PrunedDataRecorder | None = None, ranks: tuple[int, ...] | None = None,
                 rules: RuleSet | None = None, rules_first: bool = False) -> None:
        """``ranks``: the ranks that run (default: all; DP templates: one replica). ``rules``: decides
        ops whose members do not all run, and every op when ``rules_first`` (source ``rules``)."""
        if num_slots < 1:
            raise PrismError(f"collect needs at least one slot, got {num_slots}")
        self.world_size = world_size
        self.ranks = tuple(range(world_size)) if ranks is None else tuple(ranks)
        self._running = frozenset(self.ranks)
        self.rules = rules
        self.rules_first = rules_first
        self.num_slots = num_slots
        self.switcher = switcher
        self.payloads = payloads
        self.policy = policy
        self.starvation_grants = starvation_grants if starvation_grants is not None else 2 * len(self.ranks)
        self.stats = CollectStats()
        self.recorded = recorded
        self.pruned = pruned
        self._cond = threading.Condition()
        self._ranks = {r: _Rank(r) for r in self.ranks}
        self._free_slots = list(range(num_slots))
        self._instances: dict[tuple[str, int], _Instance] = {}
        self._sends: dict[tuple[int, int, str, int], Arrival] = {}
        self._recvs: dict[tuple[int, int, str, int], tuple[int, int]] = {}
        self._recvs_by_rule: set[tuple[int, int, str, int]] = set()
        self._to_spawn: list[tuple[int, int]] = []
        self._swapping: dict[int, tuple[str, float]] = {}
        self._grant_counter = 0
        self.error: PrismError | None = None
        self.max_active = 0
        with self._cond:
            self._schedule()

    # -- queries for the orchestrator -----------------------------------------------------------
    def take_spawns(self) -> list[tuple[int, int]]:
        """(rank, slot) of ranks granted their first slot since the last call: start them."""
        with self._cond:
            out, self._to_spawn = self._to_spawn, []
            return out

    def status(self, rank: int) -> RankStatus:
        with self._cond:
            return self._ranks[rank].status

    def num_finished(self) -> int:
        with self._cond:
            return sum(1 for r in self._ranks.values() if r.status is RankStatus.FINISHED)

    def all_finished(self) -> bool:
        return self.num_finished() == len(self.ranks)

    # -- handler --------------------------------------------------------------------------------
    def register(self, rank: int, pid: int) -> int:
        with self._cond:
            self._check_rank(rank)
            self._ranks[rank].pid = pid
        log.debug("rank %d registered (pid %d)", rank, pid)
        return self.world_size

    def submit(self, header: CommHeader, inputs: list[torch.Tensor]) -> bool:
        with self._cond:
            self._check_rank(header.rank)
            info = self._ranks[header.rank]
            op = _Op(header)
            info.ops[header.op_index] = op
            info.last_op = header
            if self.error is not None:
                op.error = str(self.error)
                return True
            try:
                if self.recorded is not None:
                    op.outputs = self.recorded.outputs(header)
                    self.stats.num_p2p += header.op == "recv"
                    self.stats.num_collectives += header.op not in ("send", "recv")
                elif header.op == "send":
                    self._on_send(header, inputs)
                    op.outputs = []
                elif (outputs := self._by_rule(header, inputs)) is not None:
                    self.stats.num_by_rule += 1
                    self._resolve(header.rank, header.op_index, outputs, Arrival(header, inputs),
                                  "RECV" if header.op == "recv" else "COLLECTIVE")
                elif header.op == "recv":
                    self._on_recv(header)
                else:
                    self._on_collective(header, inputs)
            except MismatchError as e:
                self._fail(MismatchError(f"{e}\n{self._report('where every rank is:')}"))
            except PrismError as e:
                self._fail(e)
            return op.done

    def fetch(self, rank: int, op_index: int) -> tuple[int, list[torch.Tensor]]:
        with self._cond:
            info = self._ranks[rank]
            op = info.ops.get(op_index)
            if op is None:
                raise FetchError(f"rank {rank}: fetch of op #{op_index} that was never submitted")
            if not op.done and not self._slot_wanted():
                # No rank waits for a slot: wait holding it. Releasing it would swap the whole device
                # context out and back in (a CUDA checkpoint of the process) for every comm op whose
                # peer is late — with K >= W, for nothing.
                info.status = RankStatus.BLOCKED
                info.waiting_op = op_index
                self.stats.num_waited_in_place += 1
                while not op.done and self.error is None and not self._slot_wanted():
                    self._cond.wait()
                if op.done or self.error is not None:
                    info.status = RankStatus.ACTIVE
                    return self._take(info, op_index)
            keep = op.done and not self._someone_starving()
            if keep:
                self.stats.num_kept_slot += 1
                return self._take(info, op_index)
            slot, info.slot = info.slot, -1
            info.status = RankStatus.READY if op.done else RankStatus.BLOCKED
            info.waiting_op = op_index
            info.candidate_since = self._grant_counter
            self.stats.num_context_switches += 1
            pid = info.pid
        # The device context leaves before the slot is handed to anyone else.
        if pid:
            self._switch(self.switcher.swap_out, rank, pid, "out")
        with self._cond:
            info.swapped_out = bool(pid)
            self._free_slots.append(slot)
            self._schedule()
            while info.status is not RankStatus.ACTIVE and self.error is None:
                self._cond.wait()
            swapped = info.swapped_out
            info.swapped_out = False
        if swapped:
            self._switch(self.switcher.swap_in, rank, pid, "in")
        with self._cond:
            return self._take(info, op_index)

    def _switch(self, call, rank: int, pid: int, direction: str) -> None:
        with self._cond:
            self._swapping[rank] = (direction, time.monotonic())
        try:
            call(pid)
        except Exception as e:
            with self._cond:
                self._fail(PrismError(f"swapping rank {rank} (pid {pid}) {direction} failed: {e}"))
            raise FetchError(str(self.error)) from e
        finally:
            with self._cond:
                self._swapping.pop(rank, None)

    def finish(self, rank: int) -> None:
        with self._cond:
            info = self._ranks[rank]
            if self.switcher.moves_device_memory:
                # Its device memory stays until the process exits (its record is still being
                # written): handing the slot on now would put K+1 ranks' memory on the device.
                info.status = RankStatus.EXITING
                self._cond.notify_all()
                return
            self._release(info, RankStatus.EXITING)

    # -- process events from the orchestrator ----------------------------------------------------
    def on_exit(self, rank: int) -> None:
        """The rank's process exited with code 0."""
        with self._cond:
            self._release(self._ranks[rank], RankStatus.FINISHED)

    def check_deadlock(self) -> MismatchError | None:
        """A report when no rank can run but some wait (the run cannot finish)."""
        with self._cond:
            statuses = {r.status for r in self._ranks.values()}
            if statuses & {RankStatus.ACTIVE, RankStatus.READY, RankStatus.NOT_STARTED, RankStatus.EXITING}:
                return None
            if RankStatus.BLOCKED not in statuses:
                return None
            err = MismatchError(self._report("deadlock: no rank can run and comm ops are pending"))
            self._fail(err)
            return err

    def stop(self, reason: str) -> None:
        with self._cond:
            if self.error is None:
                self._fail(PrismError(reason))

    def pending_report(self) -> str:
        with self._cond:
            return self._report("pending comm ops")

    def progress_mark(self) -> tuple[int, ...]:
        """Changes whenever the run moves: a comm op submitted or resolved, a rank finished, a swap."""
        with self._cond:
            return (self.stats.num_collectives, self.stats.num_p2p, self.stats.num_grants,
                    self.stats.num_waited_in_place, self.stats.num_kept_slot,
                    sum(1 for r in self._ranks.values() if r.status is RankStatus.FINISHED),
                    sum(len(r.ops) for r in self._ranks.values()))

    def stall_report(self, stalled_s: float) -> str:
        """Why nothing moved for ``stalled_s``: swaps in flight and every rank's pending op."""
        now = time.monotonic()
        with self._cond:
            swaps = [f"  rank {r}: swap {d} running for {now - t0:.0f} s (a CUDA checkpoint of the process)"
                     for r, (d, t0) in sorted(self._swapping.items())]
            running = [f"  rank {r.rank}: running its script (no comm op pending; last: "
                       f"{describe_op(r.last_op) if r.last_op else 'none yet'})"
                       for r in self._ranks.values() if r.status is RankStatus.ACTIVE and r.waiting_op < 0]
            return "\n".join([f"collect: nothing moved for {stalled_s:.0f} s", *swaps, *running,
                              self._report("pending comm ops")])

    # -- internals (lock held) ----------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if rank not in self._ranks:
            raise ValueError(f"rank {rank} does not run in this collection (ranks {format_rank_ranges(self.ranks)})")

    def _take(self, info: _Rank, op_index: int) -> tuple[int, list[torch.Tensor]]:
        op = info.ops.pop(op_index)
        if op.error:
            raise FetchError(op.error)
        if self.error is not None and op.outputs is None:
            raise FetchError(str(self.error))
        info.waiting_op = -1
        return info.slot, op.outputs or []

    def _slot_wanted(self) -> bool:
        """Whether a rank waits for a slot that none is free for."""
        return not self._free_slots and any(r.status in (RankStatus.READY, RankStatus.NOT_STARTED)
                                            for r in self._ranks.values())

    def _someone_starving(self) -> bool:
        return any(r.status is RankStatus.READY and self._grant_counter - r.candidate_since > self.starvation_grants
                   for r in self._ranks.values())

    def _release(self, info: _Rank, status: RankStatus) -> None:
        if info.slot >= 0:
            self._free_slots.append(info.slot)
            info.slot = -1
        info.status = status
        self._schedule()

    def _by_rule(self, h: CommHeader, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Outputs decided by the rules, or None when the op goes to the executor (or P2P matching)."""
        if self.rules is None:
            return None
        members = (h.peer, h.rank) if h.op == "recv" else h.group_ranks
        complete = all(m in self._running for m in members)
        if complete and not self.rules_first:
            return None
        outputs = self.rules.decide(h, inputs)
        if outputs is EXACT:
            if complete:
                return None
            outputs = self.rules.fill(h, inputs)
        if h.op == "recv":  # the matching send, if it came or comes, is dropped
            key = (h.peer, h.rank, h.group_id, h.seq)
            if self._sends.pop(key, None) is None:
                self._recvs_by_rule.add(key)
        return outputs

    def _on_collective(self, h: CommHeader, inputs: list[torch.Tensor]) -> None:
        key = (h.group_id, h.seq)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = _Instance(h.group_ranks)
        elif inst.members != h.group_ranks:
            raise MismatchError(f"collective {h.group_id}:{h.seq}: rank {h.rank} names members {list(h.group_ranks)}, "
                                f"others {list(inst.members)}")
        if h.rank in inst.arrivals:
            raise MismatchError(f"collective {h.group_id}:{h.seq}: rank {h.rank} arrived twice")
        inst.arrivals[h.rank] = Arrival(h, inputs)
        inst.op_index[h.rank] = h.op_index
        if inst.missing():
            return
        del self._instances[key]
        arrivals = [inst.arrivals[r] for r in inst.members]
        _check_same_op(arrivals)
        outputs = execute(arrivals)
        if self.pruned is not None:
            self.pruned.collective(arrivals)
        self.stats.num_collectives += 1
        for a, out in zip(arrivals, outputs, strict=True):
            self._resolve(a.header.rank, inst.op_index[a.header.rank], out, a, "COLLECTIVE")

    def _on_send(self, h: CommHeader, inputs: list[torch.Tensor]) -> None:
        key = (h.rank, h.peer, h.group_id, h.seq)
        arrival = Arrival(h, inputs)
        self._keep_inputs(h, inputs, "SEND")
        if h.peer not in self._running:  # a DP replica that does not run
            return
        if key in self._recvs_by_rule:
            self._recvs_by_rule.discard(key)
            return
        if key in self._recvs:
            rank, op_index = self._recvs.pop(key)
            self._match(arrival, rank, op_index)
        else:
            self._sends[key] = arrival

    def _on_recv(self, h: CommHeader) -> None:
        key = (h.peer, h.rank, h.group_id, h.seq)
        send = self._sends.pop(key, None)
        if send is None:
            self._recvs[key] = (h.rank, h.op_index)
        else:
            self._match(send, h.rank, h.op_index)

    def _match(self, send: Arrival, rank: int, op_index: int) -> None:
        recv = self._ranks[rank].ops[op_index].header
        self.stats.num_p2p += 1
        outputs = execute_p2p(send, recv)
        if self.pruned is not None:
            self.pruned.message(send, recv)
        self._resolve(rank, op_index, outputs, None, "RECV")

    def _keep_inputs(self, h: CommHeader, inputs: list[torch.Tensor], kind: str) -> None:
        if self.payloads is not None and self.policy is not None and inputs and self.policy.keep_inputs(h.rank):
            self.payloads.note(op_key(h.rank, h.group_id, h.seq, kind), "inputs", self.payloads.put(inputs))

    def _resolve(self, rank: int, op_index: int, outputs: list[torch.Tensor], arrival: Arrival | None,
                 kind: str) -> None:
        info = self._ranks[rank]
        op = info.ops[op_index]
        op.outputs = outputs
        h = op.header
        if self.payloads is not None and self.policy is not None:
            if arrival is not None:
                self._keep_inputs(h, arrival.inputs, kind)
            size = sum(t.numel() * t.element_size() for t in outputs)
            if outputs and self.policy.keep_outputs(rank, size):
                self.payloads.note(op_key(rank, h.group_id, h.seq, kind), "outputs", self.payloads.put(outputs))
        if info.status is RankStatus.BLOCKED and info.waiting_op == op_index:
            if info.slot >= 0:  # it waits holding its slot (fetch)
                self._cond.notify_all()
                return
            info.status = RankStatus.READY
            info.candidate_since = self._grant_counter
            self._schedule()

    def _schedule(self) -> None:
        while self._free_slots:
            candidates = [Candidate(r.rank, r.candidate_since) for r in self._ranks.values()
                          if r.status in (RankStatus.READY, RankStatus.NOT_STARTED)]
            if not candidates:
                break
            pending = pending_counts(
                [inst.missing() for inst in self._instances.values()]
                + [[src] for (src, _dst, _g, _s) in self._recvs]
            )
            best = pick_next(candidates, pending, now=self._grant_counter, starvation_grants=self.starvation_grants)
            assert best is not None
            info = self._ranks[best.rank]
            slot = self._free_slots.pop(0)
            self._grant_counter += 1
            self.stats.num_grants += 1
            info.num_grants += 1
            info.slot = slot
            if info.status is RankStatus.NOT_STARTED:
                self._to_spawn.append((info.rank, slot))
            info.status = RankStatus.ACTIVE
        active = sum(1 for r in self._ranks.values() if r.status is RankStatus.ACTIVE)
        self.max_active = max(self.max_active, active)
        self._cond.notify_all()

    def _fail(self, err: PrismError) -> None:
        if self.error is None:
            self.error = err
            log.debug("run stopped: %s", err)
        for info in self._ranks.values():
            for op in info.ops.values():
                if not op.done:
                    op.error = str(self.error)
        self._cond.notify_all()

    def _report(self, title: str) -> str:
        waiting = {}
        for info in self._ranks.values():
            op = info.ops.get(info.waiting_op) if info.waiting_op >= 0 else None
            waiting[info.rank] = (info.status.value, op.header if op else None, info.last_op)
        instances = {k: (inst.members, sorted(inst.arrivals)) for k, inst in self._instances.items()}
        recvs = sorted(self._recvs)
        sends = sorted(self._sends)
        return format_pending_report(title, waiting, instances, recvs, sends)


def _signature(h: CommHeader) -> tuple:
    metas = h.outputs or h.inputs  # non-roots of broadcast/gather/scatter hand in or get nothing
    return (h.op, h.reduce_op, h.root, h.flat, h.coalesced, metas[0].dtype if metas else "")


def _check_same_op(arrivals: list[Arrival]) -> None:
    """All members of an instance must have issued the same op; name the odd ones out."""
    by_sig: dict[tuple, list[CommHeader]] = {}
    for a in arrivals:
        by_sig.setdefault(_signature(a.header), []).append(a.header)
    if len(by_sig) == 1:
        return
    groups = sorted(by_sig.values(), key=len, reverse=True)
    majority = groups[0]
    h0 = majority[0]
    lines = [f"collective mismatch on group {h0.group_id} (ranks {list(h0.group_ranks)}) at seq {h0.seq}:"]
    for hs in groups[1:]:
        for h in hs:
            lines.append(f"  rank {h.rank} issued {_op_line(h)}")
    lines.append(f"  while ranks {format_rank_ranges([h.rank for h in majority])} issued {_op_line(h0)}")
    raise MismatchError("\n".join(lines))


def _op_line(h: CommHeader) -> str:
    return describe_op(h)
