"""A replayer process: hosts the neighbor vranks of many groups and plays their part of every op
that involves a sandbox rank (``python -m prism.vrank_replayer.main --spec SPEC.json``).

One thread per channel (:mod:`.plan`) walks its ops in order: take the op's recorded data (loaded
in the background ahead of time); for a collective, build the neighbor party of the vranks the
pruned schedule needs, ask the clock when they issue, then run the party's steps over the group's
transport (what :func:`~prism.nccl_patches.run_neighbor_side` does); for a message, ask the clock
and post the vrank's one send or receive. A vrank's message to a sandbox rank leaves from that
thread the moment the clock releases it; a helper waits for its completion.
Pruned vranks cost nothing: no thread, no buffer, no connection. On success
``<out>/replayer-<i>.json`` holds the figures; on failure the traceback goes to the error file
the supervisor reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import resource
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from prism.core.atomic import atomic_write_text
from prism.core.cprofile import profiled
from prism.core.errors import PrismError, RunDirError
from prism.core.layout import DEVICE_DATA_PATHS
from prism.core.workerspec import error_path
from prism.graph.io import read_graph
from prism.graph.records import CommOp, Node
from prism.nccl_patches import neighbor_ranks, pair, pruned_steps
from prism.nccl_patches.parties import NeighborParty
from prism.nccl_patches.pruned import start_party
from prism.nccl_patches.recorded_store import RecordedStore, collective_key, p2p_key
from prism.nccl_patches.vplan import (
    WideTagTransport,
    barrier_record,
    collective_tag_base,
    endpoint_plan,
    p2p_tag,
    transport_prefix,
)

from .clock import AsapClock, Clock, CoSimClock, TimedClock, op_key
from .device_serve import DeviceServer, lanes_of_replayer
from .plan import Channel, plan_channels

__all__ = ["ReplayerSpec", "Replayer", "clock_events", "clock_events_path", "cosim_timeline_path", "replayer_result_path", "REPLAYER_MODULE"]

log = logging.getLogger(__name__)

REPLAYER_MODULE = "prism.vrank_replayer.main"
_PREFETCH_OPS = 4
_MAX_SENDS_IN_FLIGHT = 8
_SWITCH_INTERVAL_S = 2e-4
"""The replayer is a real-time process: a channel thread whose vrank is due must not wait CPython's
default 5 ms for the GIL while another channel's thread runs Python."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayerSpec:
    index: int
    num_replayers: int
    sandbox: tuple[int, ...]
    graph_dir: str
    recorded_dir: str
    transport_store: str
    out_dir: str
    supervisor_key: int
    """The id the supervisor knows this process by (names its error file)."""
    steps: int | None = None
    timeout_s: float = 300.0
    timed_graph_dir: str = ""
    """If set, vranks follow this timed graph in real time (:class:`~.clock.TimedClock`); else ASAP."""
    device_path: str = "host"
    """``nccl``: this replayer serves its sandbox ranks' lanes from GPU ``device_index``
    (:mod:`.device_serve`); ``host``: the pruned steps over gloo transports."""
    device_index: int = -1
    clock: str = "cosim"
    """With a timed graph: ``cosim`` (:class:`~.clock.CoSimClock`, vranks simulated online and
    following the sandbox's real times) or ``offset`` (:class:`~.clock.TimedClock`)."""
    warmup_steps: int = 0
    """The job's warm-up steps: the offset clock keeps the vranks at the sandbox's pace through
    them (:class:`~.clock.TimedClock`)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> ReplayerSpec:
        data = json.loads(text)
        data["sandbox"] = tuple(data["sandbox"])
        return ReplayerSpec(**data)


def _store_client(addr: str, timeout_s: float) -> dist.Store:
    # One client per transport: a TCPStore client serializes its requests, so a rendezvous that
    # waits for a late peer would hold up every other group's rendezvous on a shared client.
    host, _, port = addr.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def cosim_timeline_path(out_dir: str | Path) -> Path:
    """The co-simulated vranks' node times (``CoSimClock.simulated``), on the real clock."""
    return Path(out_dir) / "vranks.cosim.json"


def replayer_result_path(out_dir: str | Path, index: int) -> Path:
    return Path(out_dir) / f"replayer-{index:03d}.json"


class Replayer:
    def __init__(self, spec: ReplayerSpec, *, clock: Clock | None = None) -> None:
        self.spec = spec
        self.sandbox = frozenset(spec.sandbox)
        graph = read_graph(spec.graph_dir)
        self.channels = plan_channels(graph, self.sandbox, spec.index, spec.num_replayers, steps=spec.steps)
        lanes = (lanes_of_replayer(graph, self.sandbox, spec.index, spec.num_replayers)
                 if spec.device_path in DEVICE_DATA_PATHS else [])
        del graph  # the channels keep the nodes they need
        if clock is None and spec.timed_graph_dir:
            vranks = {r for ch in self.channels for r in ch.members} - self.sandbox
            served = {op_key(n) for ch in self.channels for n in ch.nodes}  # with several replayers, not all
            timed = read_graph(spec.timed_graph_dir)
            if spec.clock == "offset":
                # The host path reports every served collective for each vrank of its group (a completion,
                # then the collective marked done, which covers pruned vranks): a vrank does not issue an op before the collectives
                # it waits for earlier in its program, even while another channel has not reached them.
                clock = TimedClock(timed, self.sandbox, vranks=vranks, served=served, timeout_s=spec.timeout_s,
                                   warmup_steps=spec.warmup_steps,
                                   collectives_told=spec.device_path not in DEVICE_DATA_PATHS)
            else:
                clock = CoSimClock(timed, self.sandbox, served=served, timeout_s=spec.timeout_s)
        self.clock = clock or AsapClock()
        self.store = RecordedStore(spec.recorded_dir)
        self._pairs = pair.enabled()
        """Groups of two with one vrank exchange once per all-reduce, all-gather and reduce-scatter
        (the host path; the device path's server runs its own)."""
        self._lock = threading.Lock()
        self._timeout = datetime.timedelta(seconds=spec.timeout_s)
        self._transports: dict[str, WideTagTransport] = {}
        self._transport_locks: dict[str, threading.Lock] = {}
        self._errors: list[BaseException] = []
        self._changed = threading.Event()
        """Set when a channel thread ends (done or failed): what run() waits for."""
        self._num_ended = 0
        self.num_ops = 0
        self.num_steps = 0
        self.channel_cpu_s: dict[str, float] = {}
        """Each channel thread's own CPU time (its Python per op; a send's helper is not counted)."""
        self.traffic_bytes = 0
        self.first_op_done_unix_s: float | None = None
        self.device: DeviceServer | None = None
        if spec.device_path in DEVICE_DATA_PATHS:
            self.device = DeviceServer(index=spec.index, device_index=spec.device_index, lanes=lanes,
                                       sandbox=self.sandbox, timeout_s=spec.timeout_s, clock=self.clock,
                                       records=self._records,
                                       store_factory=lambda: _store_client(spec.transport_store, spec.timeout_s))

    # ------------------------------------------------------------------------------ transports

    def _transport(self, ch: Channel) -> WideTagTransport:
        with self._lock:
            lock = self._transport_locks.setdefault(ch.group_id, threading.Lock())
        with lock:
            if ch.group_id not in self._transports:
                plan = endpoint_plan(ch.group_id, ch.members, self.sandbox, self.spec.num_replayers)
                self._transports[ch.group_id] = WideTagTransport.connect(
                    _store_client(self.spec.transport_store, self.spec.timeout_s), plan.replayer_endpoint, plan.num_endpoints, plan.endpoint_of,
                    timeout_s=self.spec.timeout_s, prefix=transport_prefix(ch.group_id),
                )
            return self._transports[ch.group_id]

    # ---------------------------------------------------------------------------- one channel

    def _keys(self, ch: Channel, node: Node, part: int) -> str:
        if ch.is_p2p:
            return p2p_key(ch.group_id, ch.src, ch.dst, node.seq, part)
        return collective_key(ch.group_id, node.seq, part)

    def _records(self, ch: Channel, node: Node) -> list:
        n = len(ch.members)
        if node.op is CommOp.BARRIER:
            return [barrier_record(n, [g for g, r in enumerate(ch.members) if r in self.sandbox])]
        num = self.store.num_parts(lambda i: self._keys(ch, node, i))
        records = [self.store.get(self._keys(ch, node, i)) for i in range(num)]
        if num == 0 or any(r is None for r in records):  # none indexed, or an indexed file is gone
            what = f"{node.op.value} on group {ch.group_id} seq {node.seq}"
            if ch.is_p2p:
                what = f"message {ch.src}->{ch.dst} on group {ch.group_id} seq {node.seq}"
            raise RunDirError(f"{self.spec.recorded_dir}: no recorded data for {what} (rank {node.rank}, "
                              f"{node.call_site or '?'}); record it for sandbox ranks {sorted(self.sandbox)}")
        return records

    def _played(self, ch: Channel, node: Node, party: NeighborParty, finish, last: bool = True) -> None:
        traffic = finish()
        for v in sorted(party.hosted) if last else ():
            self.clock.on_complete(ch.members[v], node)
        with self._lock:
            self.num_steps += len(party.steps)
            self.traffic_bytes += sum(t.num_bytes for t in traffic.values())

    def _reads_records(self, ch: Channel) -> bool:
        """Whether the channel's ops need recorded data: all but a stream a sandbox rank sends on."""
        return not (ch.is_p2p and ch.src in self.sandbox)

    def _op_played(self) -> None:
        with self._lock:
            self.num_ops += 1
            if self.first_op_done_unix_s is None:
                self.first_op_done_unix_s = time.time()

    def _message_done(self, ch: Channel, node: Node, vrank: int, work, num_bytes: int, last: bool) -> None:
        if not work.wait(self._timeout):
            raise PrismError(f"message {ch.src}->{ch.dst} on group {ch.group_id} seq {node.seq}: "
                             f"timed out after {self.spec.timeout_s}s")
        if last:
            self.clock.on_complete(vrank, node)
        with self._lock:
            self.num_steps += 1
            self.traffic_bytes += num_bytes

    def _post_message(self, ch: Channel, node: Node, part: int, tensor: torch.Tensor,
                      transport: WideTagTransport) -> dist.Work:
        """A vrank's end of one message with a sandbox rank (one record part: one tensor), posted once
        the clock releases the vrank: the pruned party's one EXCHANGE step without its machinery
        (schedule, party, step driver). Every message of a short-step pipeline crosses the replayer;
        its Python there per message, under the one GIL of all its channels, delays the completions
        the vranks' clock anchors on (docs/emulate.md, "The replayer's cost per message"). A vrank's
        receive reads no recorded data: the sandbox's message is consumed, not used, so its buffer
        is sized from the graph. ``tensor``: what the vrank sends, or where it receives."""
        src, dst = ch.members.index(ch.src), ch.members.index(ch.dst)  # group ranks
        tag = p2p_tag(node.seq, part, len(ch.members), src, dst)
        if ch.src in self.sandbox:
            self.clock.wait_until_issue(ch.dst, node)
            return transport.recv(tensor, src, dst, tag)
        self.clock.wait_until_issue(ch.src, node)
        return transport.send(tensor, src, dst, tag)

    def _serve(self, ch: Channel) -> None:
        transport = self._transport(ch)
        # A vrank's sends are posted when it issues them, on this thread, and complete on their own
        # (isend): a helper waits for each, and the next send does not wait for the sandbox to
        # receive the previous one.
        detached = ThreadPoolExecutor(_MAX_SENDS_IN_FLIGHT, thread_name_prefix=f"prism-send-{ch.name}") \
            if ch.is_p2p and ch.src not in self.sandbox else None
        in_flight: deque[Future] = deque()
        for k, node in enumerate(ch.nodes):
            if self._reads_records(ch):
                ahead = ch.nodes[k + 1 : k + 1 + _PREFETCH_OPS] if k == 0 else ch.nodes[k + _PREFETCH_OPS : k + 1 + _PREFETCH_OPS]
                self.store.prefetch(self._keys(ch, nxt, 0) for nxt in ahead if nxt.op is not CommOp.BARRIER)
            if ch.is_p2p:
                self._serve_message(ch, node, transport, detached, in_flight)
            else:
                self._serve_collective(ch, node, transport)
            self._op_played()
        if detached is not None:
            for f in in_flight:
                f.result()
            detached.shutdown()

    def _serve_message(self, ch: Channel, node: Node, transport: WideTagTransport,
                       detached: ThreadPoolExecutor | None, in_flight: deque[Future]) -> None:
        # Built before the vrank is due: its receive buffers (gloo moves bytes), or what it sends
        # (what the sandbox rank received in the collected run).
        if ch.src in self.sandbox:
            vrank, tensors = ch.dst, [torch.empty(b, dtype=torch.uint8) for b in _message_part_bytes(node)]
        else:
            dst = ch.members.index(ch.dst)
            vrank, tensors = ch.src, [rec.outputs[dst].contiguous() for rec in self._records(ch, node)]
        for part, tensor in enumerate(tensors):
            last = part == len(tensors) - 1
            if detached is not None:  # a stream's sends complete in order
                while in_flight and (in_flight[0].done() or len(in_flight) >= _MAX_SENDS_IN_FLIGHT):
                    in_flight.popleft().result()  # the tag window of a stream; raises a send's error
            work = self._post_message(ch, node, part, tensor, transport)
            num_bytes = tensor.numel() * tensor.element_size()
            if detached is None:
                self._message_done(ch, node, vrank, work, num_bytes, last)
            else:
                in_flight.append(detached.submit(self._message_done, ch, node, vrank, work, num_bytes, last))

    def _serve_collective(self, ch: Channel, node: Node, transport: WideTagTransport) -> None:
        if self._pairs and pair.runs_as_pair(node.op, node.reduce_op, ch.members, self.sandbox):
            self._serve_pair(ch, node, transport)
            return
        n = len(ch.members)
        parts = []
        for part, rec in enumerate(self._records(ch, node)):
            pruned = pruned_steps(rec)
            hosted = neighbor_ranks(rec, pruned)
            if hosted:
                parts.append((part, rec, pruned, hosted))
        for k_part, (part, rec, pruned, hosted) in enumerate(parts):
            last = k_part == len(parts) - 1  # the vranks' part of the op is done with its last part
            party = NeighborParty(rec, hosted, pruned)  # everything but the transfers, before the vranks are due
            for v in sorted(hosted):
                self.clock.wait_until_issue(ch.members[v], node)
            finish = start_party(party, transport, n, tag_base=collective_tag_base(node.seq, part, n),
                                 timeout_s=self.spec.timeout_s)
            self._played(ch, node, party, finish, last)
        self.clock.collective_done(node)

    def _serve_pair(self, ch: Channel, node: Node, transport: WideTagTransport) -> None:
        """The vrank's end of a pair's exchange (:mod:`prism.nccl_patches.pair`): per part, one send of
        what the collector recorded and one receive of the sandbox rank's, posted at the vrank's
        issue."""
        what = f"{node.op.value} on group {ch.group_id} seq {node.seq}"
        (vrank,) = (r for r in ch.members if r not in self.sandbox)
        v = ch.members.index(vrank)
        s = 1 - v
        exchanges = []
        for part, rec in enumerate(self._records(ch, node)):  # what it sends, before the vrank is due
            exchanges.append((part, pair.vrank_sends(node.op, rec, what).contiguous(),
                              torch.empty(pair.vrank_receive_numel(node.op, rec), dtype=rec.inputs[s].dtype)))
        self.clock.wait_until_issue(vrank, node)
        works = []
        for part, sent, buf in exchanges:
            works.append(transport.send(sent, v, s, pair.pair_tag(node.seq, part, v)))
            works.append(transport.recv(buf, s, v, pair.pair_tag(node.seq, part, s)))
        for work in works:
            if not work.wait(self._timeout):
                raise PrismError(f"{what}: timed out after {self.spec.timeout_s}s")
        self.clock.on_complete(vrank, node)
        with self._lock:
            self.num_steps += len(exchanges)
            self.traffic_bytes += sum(sent.numel() * sent.element_size() for _, sent, _ in exchanges)
        self.clock.collective_done(node)

    def _thread(self, ch: Channel) -> None:
        cpu_start = time.thread_time()
        try:
            with profiled("replayer"):
                self._thread_body(ch)
        finally:
            with self._lock:
                self._num_ended += 1
                self.channel_cpu_s[ch.name] = time.thread_time() - cpu_start
            self._changed.set()

    def _thread_body(self, ch: Channel) -> None:
        try:
            if self.device is not None:
                self.device.serve(ch)
                with self._lock:
                    if self.first_op_done_unix_s is None:
                        self.first_op_done_unix_s = time.time()
                return
            with torch.no_grad():
                self._serve(ch)
        except BaseException as e:  # noqa: BLE001 - reported by run()
            log.error("replayer %d: channel %s failed", self.spec.index, ch.name, exc_info=True)
            with self._lock:
                self._errors.append(e)

    def _preload(self) -> None:
        """Load the records of every op served, in the order they are due (within the store's
        budget), before the first op, as the device path does: loading while the ops run took the
        CPU and the GIL from the first measured steps (pp_sleep_noopt at short steps on 2 cores:
        their first six steps 20–34 ms against 15, docs/emulate.md, session 48)."""
        due = []
        for ch in filter(self._reads_records, self.channels):
            by_seq: dict[int, list[str]] = {}
            for key in self.store.keys_under(self._keys(ch, ch.nodes[0], 0).rsplit("/", 2)[0] + "/"):
                by_seq.setdefault(int(key.rsplit("/", 2)[1]), []).append(key)
            due.extend((node.start_ns, key) for node in ch.nodes for key in by_seq.get(node.seq, ()))
        started = time.monotonic()
        num = self.store.preload(key for _, key in sorted(due))
        self.store.wait_loaded(self.spec.timeout_s)
        log.debug("replayer %d: %d records loaded in %.3f s", self.spec.index, num, time.monotonic() - started)

    def run(self) -> dict:
        start = time.time()
        cpu_start = time.process_time()
        if self.device is not None:
            self.device.connect_all()
            self.device.preload(self.channels)
        else:
            self._preload()
        threads = [threading.Thread(target=self._thread, args=(ch,), name=f"prism-replay-{ch.name}", daemon=True)
                   for ch in self.channels]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.spec.timeout_s
        # A failed channel must stop the process even while other channels wait for the sandbox
        # (which may be waiting on the failed one). Woken when a channel ends, not by a poll: a
        # poll's wake-ups would take the GIL from the channel threads while ops are served.
        while not self._errors and (now := time.monotonic()) < deadline:
            self._changed.clear()
            with self._lock:
                if self._num_ended == len(threads):
                    break
            self._changed.wait(deadline - now)
        if self._errors:
            raise self._errors[0]
        for t in threads:  # each has ended its work; let it finish exiting
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise PrismError(f"replayer {self.spec.index}: channels still waiting after {self.spec.timeout_s:.0f} s: {stuck}")
        self.store.close()
        device = self.device
        if device is not None:
            device.close()
        return {
            "index": self.spec.index,
            "device_path": self.spec.device_path,
            "diverged_ops": {str(r): v for r, v in device.diverged.items()} if device is not None else {},
            "phase_s": {k: round(v, 4) for k, v in device.phase_s.items()} if device is not None else {},
            "num_recorded_outputs": device.num_recorded_outputs if device is not None else 0,
            "num_transfer_holds": device.num_transfer_holds if device is not None else 0,
            "links": ({lane.prefix: {"latency_us": round(m.latency_ns / 1e3, 2), "ns_per_byte": round(m.ns_per_byte, 4)}
                       for lane, m in device.links.items()} if device is not None else {}),
            "num_channels": len(self.channels),
            "num_transports": len(self._transports),
            "num_connections": sum(t.pg.size() - 1 for t in self._transports.values()),
            "num_ops": self.num_ops + (device.num_ops if device is not None else 0),
            "num_steps": self.num_steps,
            "traffic_bytes": self.traffic_bytes + (device.traffic_bytes if device is not None else 0),
            "first_op_done_unix_s": self.first_op_done_unix_s,
            "wall_s": time.time() - start,
            "cpu_s": time.process_time() - cpu_start,  # all its threads: the cost of serving the ops
            "channel_cpu_s": {name: round(v, 6) for name, v in sorted(self.channel_cpu_s.items())},
            "channel_ops": {ch.name: len(ch.nodes) for ch in self.channels},
            "clock_idle_wakeups": getattr(self.clock, "idle_wakeups", 0),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {REPLAYER_MODULE}")
    parser.add_argument("--spec", required=True)
    ns = parser.parse_args(argv)
    spec = ReplayerSpec.from_json(Path(ns.spec).read_text())
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    logging.basicConfig(level=os.environ.get("PRISM_LOG_LEVEL", "WARNING"),
                        format=f"[replayer{spec.index}] %(levelname)s %(name)s: %(message)s")
    try:
        replayer = Replayer(spec)
        result = replayer.run()
        events = getattr(replayer.clock, "events", None)
        if events is not None:  # real times of the vranks' ops (the emulated timeline)
            atomic_write_text(clock_events_path(spec.out_dir, spec.index), json.dumps(events))
        simulated = getattr(replayer.clock, "simulated", None)
        if simulated is not None and spec.index == 0:  # every replayer simulates all vranks alike
            atomic_write_text(cosim_timeline_path(spec.out_dir), json.dumps(simulated()))
    except BaseException:
        atomic_write_text(error_path(spec.out_dir, spec.supervisor_key), f"replayer {spec.index}:\n{traceback.format_exc()}")
        return 1
    atomic_write_text(replayer_result_path(spec.out_dir, spec.index), json.dumps(result, indent=1))
    return 0


def _message_part_bytes(node: Node) -> list[int]:
    """The bytes of each tensor (each record part) of the message ``node``, from its graph node."""
    numels = [math.prod(shape) for shape in node.shapes]
    total = sum(numels)
    return [node.size_bytes * k // total if total else 0 for k in numels]


def clock_events_path(out_dir: str | Path, index: int) -> Path:
    return Path(out_dir) / f"replayer-{index:03d}.clock.json"


def clock_events(out_dir: str | Path) -> list[tuple[int, int, str, int]]:
    """Every replayer's clock events of an emulation, ``(vrank, op index, kind, ns)``, in the order
    each replayer logged them (``issue`` / ``complete``: perf_counter_ns; ``anchor``: the offset)."""
    return [tuple(e) for f in sorted(Path(out_dir).glob("replayer-*.clock.json")) for e in json.loads(f.read_text())]

