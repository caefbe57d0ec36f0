"""Hangs that explain themselves: the launcher's watcher over the comm ops every rank publishes.

Each rank worker (``prism.sandbox.opwatch``) pushes, every ~0.1 s, the ops it issued and completed
since the last push to a queue of the launcher's store (one queue per rank, :func:`queue_key`).
The launcher's :class:`HangWatcher` drains those queues from its supervision loop and

* compares the *fingerprint* of every collective instance (group, seq) and every message
  (group, src>dst, seq) across the ranks that issued it — like PyTorch's
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` collective fingerprint check: a disagreement stops the run at
  once (:class:`~prism.core.errors.MismatchError`) naming the op, the shapes and the disagreeing
  ranks;
* notices a rank that finished without issuing an op its peers wait in (a deadlock);
* when no rank issued or completed an op for the run's timeout (a stall), stops it with every
  rank's pending op (:class:`~prism.core.errors.HangError`). The launchers then give the
  supervisor no wall-clock limit: a run that keeps communicating is not stopped.

Lines of the protocol (tab-separated, one op per line, several lines per queue item):

``G <gid> <ranks>``                      a group's members (rank ranges), before its first op
``O <token> <key> <members> <fp> <issue_ns> <detail>``   an issued op; ``members`` is ``g:<gid>`` for
                                        a collective, ``p:<src>,<dst>`` for a message; ``fp`` is what
                                        every member must agree on; ``issue_ns`` is on the host's
                                        monotonic clock (``time.perf_counter_ns``)
``C <token> <token> ...``                ops that completed
``F``                                   the rank's program ended successfully (it issues nothing more)
``X <time_ns> <traceback as JSON>``       the rank's program failed (pushed before its engine shuts
                                        down, so before its peers fail on the lost connections)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .errors import HangError, MismatchError, PrismError, RankFailedError, crash_site
from .ranks import format_rank_ranges, parse_rank_ranges

__all__ = ["HangWatcher", "Reference", "queue_key", "rank_timeout_s", "KEY_PREFIX"]

log = logging.getLogger(__name__)

KEY_PREFIX = "prism/opwatch/"
Reference = Callable[[int, str], "tuple[str, str] | None"]
"""``(rank, op key) -> (fingerprint, description)`` of the op a rank's unwatched peers expect."""
_MAX_PENDING_SHOWN = 4
_MAX_INSTANCES_SHOWN = 8
_MISMATCH_GRACE_S = 2.0


def rank_timeout_s(timeout_s: float) -> float:
    """The timeout a watched rank's own waits get (its gloo/NCCL groups, store, transports): longer
    than the watcher's stall limit, so that the watcher, which can say why, speaks first."""
    return timeout_s + max(10.0, 0.1 * timeout_s)


def queue_key(rank: int) -> str:
    """The store queue a rank pushes its op lines to."""
    return f"{KEY_PREFIX}{rank}"


@dataclass(slots=True)
class _Op:
    rank: int
    detail: str
    issue_ns: int
    key: str = ""
    fp: str = ""


@dataclass(slots=True)
class _Instance:
    """One collective instance or message, as far as the ranks have issued it."""

    expected: frozenset[int]
    by_fp: dict[str, list[_Op]] = field(default_factory=dict)

    def seen(self) -> set[int]:
        return {op.rank for ops in self.by_fp.values() for op in ops}


@dataclass(slots=True)
class _Rank:
    pending: dict[int, _Op] = field(default_factory=dict)
    last: _Op | None = None
    num_issued: int = 0
    finished: bool = False
    failed: tuple[int, str] | None = None
    """(when, traceback) if the rank's program raised."""


class HangWatcher:
    """Watches the ops of ``ranks`` through ``store`` (any c10d store with queues: the launcher's
    TCPStore). Call :meth:`tick` from the supervision loop; it raises when the run must stop."""

    def __init__(self, store, ranks: Iterable[int], *, timeout_s: float, poll_s: float = 0.2,
                 timeout_hint: str = "--timeout") -> None:
        self._store = store
        self._ranks = {r: _Rank() for r in ranks}
        self._groups: dict[str, frozenset[int]] = {}
        self._instances: dict[str, _Instance] = {}
        self._timeout_s = timeout_s
        self._timeout_hint = timeout_hint
        self._poll_s = poll_s
        self._progress = time.monotonic()
        """When a rank last issued or completed an op, or finished (the launch, before any)."""
        self._next_poll = 0.0
        self._lost = False
        self._mismatched: list[str] = []
        self._mismatch_seen: float | None = None
        self._deadlock_seen: dict[str, float] = {}
        self._deadlocked: list[str] = []

    # -- the supervision loop's side ----------------------------------------------------------------
    def tick(self) -> None:
        """Read what the ranks published (at most every ``poll_s``); raise MismatchError on a
        disagreement or a rank that finished without an op its peers wait in, HangError when no
        rank issued or completed an op for ``timeout_s`` (a stall)."""
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self._poll_s
            self.poll()
        if time.monotonic() - self._progress > self._timeout_s:
            raise HangError(f"no progress for {self._timeout_s:g} s ({self._timeout_hint}): no rank issued or "
                            f"completed a comm op; {self._still_running()}\n{self.report()}")

    def rank_finished(self, rank: int) -> None:
        """The rank's process exited successfully: every op it will ever issue is published."""
        if rank not in self._ranks:
            return
        self._ranks[rank].finished = True
        self._progress = time.monotonic()
        self._deadlocked.extend(self._instances)
        self.poll()

    def explain_failure(self, error: RankFailedError, reference: Reference | None = None, *,
                        who: str = "") -> PrismError:
        """The error to show for a failed rank: a mismatch or deadlock among the published ops if
        there is one (a peer often fails first on a lost connection), else ``error`` itself.

        ``reference(rank, key)`` gives ``(fingerprint, description)`` of the op the unwatched peers
        expect from ``rank`` at ``key`` (an emulation's virtual ranks replay the recorded run), or
        None; a rank whose last or pending op differs from it is the cause. ``who`` names the failed
        process when it is not a rank (a replayer)."""
        last = crash_site(error.traceback_text).error or f"exit code {error.exit_code}"
        then = f"(then {who or f'rank {error.rank}'} failed: {last[:200]}{'…' if len(last) > 200 else ''})"
        try:
            self.poll(now=True)
        except MismatchError as cause:
            return MismatchError(f"{cause}\n{then}")
        first = min(((s.failed, r) for r, s in self._ranks.items() if s.failed), default=None)
        if first is not None and first[1] != error.rank:
            # A peer's lost connection was seen first; the rank whose program raised first is the cause.
            (_, text), rank = first
            return RankFailedError(rank, f"{text.rstrip()}\n{then}", exit_code=1)
        if reference is None:
            return error
        for rank, state in sorted(self._ranks.items()):
            for op in (*state.pending.values(), *([state.last] if state.last else [])):
                want = reference(rank, op.key)
                if want is not None and want[0] != op.fp:
                    return MismatchError(
                        f"collective mismatch at {_key_text(op.key)}:\n  rank {rank} issued {op.detail}\n"
                        f"  where the recorded run has {want[1]} (which its virtual peers replay)\n"
                        f"{then}\n{self.report()}")
        return error

    def poll(self, *, now: bool = False) -> None:
        """Read every rank's queue, then raise MismatchError if ranks disagree or a finished rank
        never issued an op its peers wait in. A disagreement is reported once every watched member
        has issued the op, or ``_MISMATCH_GRACE_S`` after it was seen (or at once with ``now``), so
        that the report can say which ranks are the odd ones out."""
        for rank in self._ranks:
            self._drain(rank)
        if self._mismatched:
            key = self._mismatched[0]
            inst = self._instances[key]
            if self._mismatch_seen is None:
                self._mismatch_seen = time.monotonic()
            if now or inst.seen() >= inst.expected or time.monotonic() - self._mismatch_seen > _MISMATCH_GRACE_S:
                raise MismatchError(self._mismatch_text(key))
        keep = []
        for key in self._deadlocked:
            inst = self._instances.get(key)
            gone = sorted(r for r in inst.expected - inst.seen() if self._ranks[r].finished) if inst else ()
            if gone:
                # Report once every member that can still issue it has (or after the grace).
                first = self._deadlock_seen.setdefault(key, time.monotonic())
                live = {r for r in inst.expected if not self._ranks[r].finished}
                if not (now or inst.seen() >= live or time.monotonic() - first > _MISMATCH_GRACE_S):
                    keep.append(key)
                    continue
                op = next(iter(inst.by_fp.values()))[0]
                seen = sorted(inst.seen())
                raise MismatchError(
                    f"deadlock: rank{'s' if len(gone) > 1 else ''} {format_rank_ranges(gone)} finished without "
                    f"issuing {op.detail}, which rank{'s' if len(seen) > 1 else ''} {format_rank_ranges(seen)} "
                    f"wait{'' if len(seen) > 1 else 's'} in\n{self.report()}")
        self._deadlocked[:] = list(dict.fromkeys(keep))

    # -- reading the queues -------------------------------------------------------------------------
    def _drain(self, rank: int) -> None:
        if self._lost:
            return
        key = queue_key(rank)
        try:
            n = self._store.queue_len(key)
            items = [self._store.queue_pop(key, False) for _ in range(n)]
        except Exception:  # noqa: BLE001 - the store went away: the supervisor reports the cause
            log.debug("hang watcher: store unreachable", exc_info=True)
            self._lost = True
            return
        if items:
            self._progress = time.monotonic()
        for item in items:
            for line in (item.decode() if isinstance(item, bytes) else item).splitlines():
                self._on_line(rank, line)

    def _on_line(self, rank: int, line: str) -> None:
        kind, _, rest = line.partition("\t")
        state = self._ranks[rank]
        if kind == "G":
            gid, ranks = rest.split("\t")
            self._groups[gid] = frozenset(parse_rank_ranges(ranks)) & self._ranks.keys()
        elif kind == "C":
            for tok in rest.split():
                state.pending.pop(int(tok), None)
        elif kind == "X":
            time_ns, text = rest.split("\t", 1)
            state.failed = (int(time_ns), json.loads(text))
        elif kind == "F":
            state.finished = True
            self._deadlocked.extend(self._instances)
        elif kind == "O":
            tok, key, members, fp, issue_ns, detail = rest.split("\t", 5)
            op = _Op(rank, detail, int(issue_ns), key, fp)
            state.pending[int(tok)] = op
            state.last = op
            state.num_issued += 1
            self._on_op(key, members, fp, op)
        else:
            log.debug("hang watcher: unknown line from rank %d: %r", rank, line)

    def _expected(self, members: str) -> frozenset[int]:
        """The watched members of an op: its group's (cached per group), or a message's two ends."""
        kind, _, what = members.partition(":")
        if kind == "p":
            return frozenset(int(r) for r in what.split(",")) & self._ranks.keys()
        return self._groups.get(what, frozenset())

    def _on_op(self, key: str, members: str, fp: str, op: _Op) -> None:
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = _Instance(self._expected(members))
        inst.by_fp.setdefault(fp, []).append(op)
        if len(inst.by_fp) > 1:
            if key not in self._mismatched:
                self._mismatched.append(key)
        elif inst.seen() >= inst.expected:
            del self._instances[key]
        elif any(self._ranks[r].finished for r in inst.expected):
            self._deadlocked.append(key)

    # -- reports --------------------------------------------------------------------------------------
    def _mismatch_text(self, key: str) -> str:
        inst = self._instances[key]
        variants = sorted(inst.by_fp.values(), key=len, reverse=True)
        latest = max(op.issue_ns for ops in variants for op in ops)
        after = (time.perf_counter_ns() - latest) / 1e9
        head = variants[0]
        lines = [f"collective mismatch at {_key_text(key)}:"]
        for ops in variants[1:]:
            for op in ops:
                lines.append(f"  rank {op.rank} issued {op.detail}")
        lines.append(f"  while rank{'s' if len(head) > 1 else ''} {format_rank_ranges(sorted(o.rank for o in head))} "
                     f"issued {head[0].detail}")
        lines.append(f"(detected {after:.1f} s after the last of them was issued)")
        lines.append(self.report())
        return "\n".join(lines)

    def _still_running(self) -> str:
        running = [r for r, s in sorted(self._ranks.items()) if not s.finished]
        return f"ranks still running: {format_rank_ranges(running)}" if running else "every rank finished"

    def report(self) -> str:
        """Every rank's pending ops (oldest first), and the instances some member has not issued."""
        now = time.perf_counter_ns()
        lines = ["where every rank is:"]
        for rank, s in sorted(self._ranks.items()):
            # A finished rank waits in nothing: an op of it still pending here is one whose
            # completion callback had not run when the program returned from its wait and exited.
            if s.pending and not s.finished:
                ops = sorted(s.pending.values(), key=lambda o: o.issue_ns)
                shown = "; ".join(f"{o.detail} (issued {(now - o.issue_ns) / 1e9:.1f} s ago)"
                                  for o in ops[:_MAX_PENDING_SHOWN])
                more = f" (+{len(ops) - _MAX_PENDING_SHOWN} more)" if len(ops) > _MAX_PENDING_SHOWN else ""
                lines.append(f"  rank {rank}: waits in {shown}{more}")
            elif s.num_issued == 0:
                lines.append(f"  rank {rank}: {'finished' if s.finished else 'running'}, no comm op issued yet")
            else:
                status = "finished" if s.finished else "no comm op pending"
                lines.append(f"  rank {rank}: {status}; its last op {s.last.detail} (issued "
                             f"{(now - s.last.issue_ns) / 1e9:.1f} s ago)")
        missing = []
        for key, inst in self._instances.items():
            absent = sorted(inst.expected - inst.seen())
            if absent:
                op = next(iter(inst.by_fp.values()))[0]
                missing.append(f"  {op.detail}: rank{'s' if len(inst.seen()) > 1 else ''} "
                               f"{format_rank_ranges(sorted(inst.seen()))} issued it, "
                               f"{format_rank_ranges(absent)} not yet")
        if missing:
            lines.append("ops not issued by every member:")
            lines.extend(missing[:_MAX_INSTANCES_SHOWN])
            if len(missing) > _MAX_INSTANCES_SHOWN:
                lines.append(f"  (+{len(missing) - _MAX_INSTANCES_SHOWN} more)")
        return "\n".join(lines)


def _key_text(key: str) -> str:
    """``0:5`` -> ``group 0 seq 5``; ``0:1>2:3`` -> ``group 0 message 1->2 seq 3``."""
    parts = key.split(":")
    if len(parts) == 3:
        src, dst = parts[1].split(">")
        return f"group {parts[0]} message {src}->{dst} seq {parts[2]}"
    return f"group {parts[0]} seq {parts[1]}"
