"""Publish this rank's comm ops to the launcher's store, for its hang watcher (``prism.core.hangwatch``).

The process group calls :meth:`OpPublisher.issued` and :meth:`OpPublisher.completed` on every op:
each is one ``deque.append`` (well under a microsecond). A daemon thread wakes every
``interval_s``, formats what arrived since (the op's fingerprint and description from the
recorder's node: kind, group, seq, shapes, dtype, call site) and pushes it as one item to the rank's
queue in the store, over its own connection. :meth:`OpPublisher.close` pushes the rest
synchronously, so the launcher knows every op of a rank whose process has exited.

A worker publishes when its launcher watches (engine option ``opwatch=1``, set by
``prism.sandbox.launch`` and ``prism.vrank_replayer.launch``; not under torchrun's ``-m
prism.record``, whose store nobody drains). ``PRISM_OPWATCH=0`` in the environment turns
publication off (to measure its cost).
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import threading
import time

import torch.distributed as dist

from prism.core.hangwatch import queue_key
from prism.core.ranks import format_rank_ranges
from prism.graph.opsig import describe, fingerprint, op_key

from .engines.base import GroupHandle

__all__ = ["OpPublisher", "enabled", "ENGINE_OPTION"]

log = logging.getLogger(__name__)

ENGINE_OPTION = "opwatch"
"""A worker publishes when its launcher sets this engine option to "1" (the launcher watches)."""


def enabled() -> bool:
    return os.environ.get("PRISM_OPWATCH", "1") != "0"


class OpPublisher:
    """One rank's publisher (see the module docstring). ``node_of(token)`` returns the recorder's
    node fields of an issued op (its ``start_ns``: ``perf_counter_ns`` on the host, or on CUDA a
    stamp resolved only at the end — then the push's time stands in)."""

    def __init__(self, store_addr: str, rank: int, node_of, *, timeout_s: float, interval_s: float = 0.1) -> None:
        self._addr = store_addr
        self._rank = rank
        self._node_of = node_of
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self._issued: collections.deque = collections.deque()
        self._completed: collections.deque = collections.deque()
        self._groups: set[str] = set()
        self._formats: dict[tuple, tuple[str, str, str, str]] = {}
        self._store = None
        self._broken = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"prism-opwatch-{rank}", daemon=True)
        self._thread.start()

    # -- hot path (any thread) --------------------------------------------------------------------
    def issued(self, token: int, group: GroupHandle) -> None:
        self._issued.append((token, group))

    def completed(self, token: int) -> None:
        self._completed.append(token)

    # -- the publishing thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()

    def flush(self) -> None:
        """Push what arrived since the last push (one store item)."""
        with self._lock:
            if self._broken:
                return
            # Completions first: every token completed by now was issued before this point.
            done = [self._completed.popleft() for _ in range(len(self._completed))]
            issued = [self._issued.popleft() for _ in range(len(self._issued))]
            if not done and not issued:
                return
            lines = [self._op_line(token, group) for token, group in issued]
            ends = [t for t in done if not isinstance(t, int)]
            if ends:
                done = [t for t in done if isinstance(t, int)]
            if done:
                lines.append("C\t" + " ".join(map(str, done)))
            for end in ends:
                lines.append("F" if end == "F" else f"X\t{end[1]}\t{json.dumps(end[2])}")
            try:
                if self._store is None:
                    host, _, port = self._addr.rpartition(":")
                    self._store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                                timeout=datetime.timedelta(seconds=self._timeout_s))
                self._store.queue_push(queue_key(self._rank), "\n".join(lines))
            except Exception:  # noqa: BLE001 - the launcher is gone; nobody to tell
                log.debug("rank %d: cannot publish ops to %s", self._rank, self._addr, exc_info=True)
                self._broken = True

    def _op_line(self, token: int, group: GroupHandle) -> str:
        node = self._node_of(token)
        gid = node["group_id"]
        head = ""
        if gid not in self._groups:
            self._groups.add(gid)
            head = f"G\t{gid}\t{format_rank_ranges(sorted(group.ranks))}\n"
        # A training loop issues the same few ops over and over: format each kind once.
        kind = (node["op"], gid, node.get("reduce_op"), node.get("peer", -1), node.get("dtype"), node["shapes"],
                node.get("out_shapes"), node.get("call_site"))
        parts = self._formats.get(kind)
        if parts is None:
            if len(self._formats) > 10_000:
                self._formats.clear()
            parts = self._formats[kind] = self._format(node)
        key_prefix, rest, before, after = parts
        seq = node["seq"]
        start = node.get("start_ns")
        issue_ns = start if isinstance(start, int) else time.perf_counter_ns()
        return f"{head}O\t{token}\t{key_prefix}{seq}\t{rest}\t{issue_ns}\t{before}{seq}{after}"

    def _format(self, node: dict) -> tuple[str, str, str, str]:
        """(key without the seq, members and fingerprint, description before and after the seq)."""
        key_prefix, members = op_key(node, self._rank)
        return (key_prefix, f"{members}\t{fingerprint(node)}", *describe(node))

    def close(self, *, finished: bool, error: str = "") -> None:
        """Push the rest and stop (the rank's program has ended; ``finished``: successfully, so it
        will issue nothing more — a peer waiting for it waits forever; ``error``: it failed, with
        this traceback)."""
        self._stop.set()
        self._thread.join(timeout=self._interval_s * 10)
        if finished:
            self._completed.append("F")
        if error:
            self._completed.append(("X", time.perf_counter_ns(), error))
        self.flush()
