"""The replayer's side of the GPU data path (``nccl`` layout, :mod:`prism.sandbox.engines.device_path`).

The replayer runs on an assistant GPU. For each op of a channel it receives the sandbox ranks'
inputs over their lanes, runs the pruned collective in this process on the device
(:func:`~prism.nccl_patches.pruned.run_in_process`: each sandbox rank's real combine steps with
the data it sent, the neighbor vranks' recorded partials and compensation), waits until the
vranks are due (the clock: the timed graph's calibrated times in an emulation, at once in a
calibration slice), and sends each sandbox rank its outputs. When every input the sandbox ranks
sent is bitwise the recorded one (an unchanged job), the outputs are the recorded ones and the
ring is not run (:func:`_recorded_outputs`). Before any transfer of an op, the graph's size of a
sandbox rank's input is checked against the recorded data (:func:`_check_recorded_size`). A transfer that the local link
finishes early is therefore held until the calibrated time without any GPU spinning (the send is
not enqueued before it is due). The replayer's CPU time per phase of serving is in its result
(``phase_s``).

The recorded data of every op served is moved to the assistant GPU before the first op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from prism.core.config import normalize_dtype
from prism.core.errors import MismatchError
from prism.graph.records import CommOp, Node
from prism.nccl_patches import neighbor_ranks, pruned_steps
from prism.nccl_patches.compensation import (
    RecordedCollective,
    describe,
    matches_record,
    recorded_on_another_path,
    same_bits,
)
from prism.nccl_patches.ipc_lane import IpcLane, same_gpu
from prism.nccl_patches.linkmodel import LinkModel, probe_time
from prism.nccl_patches.parties import NeighborParty, SandboxParty, recorded_geometry
from prism.nccl_patches.pruned import run_in_process
from prism.nccl_patches.schedule import Algo, critical_path
from prism.nccl_patches.vplan import Lane, receives_output, sends_input

from .clock import AsapClock
from .plan import Channel

__all__ = ["DeviceServer", "to_device"]

log = logging.getLogger(__name__)

_SANDBOX_END = 0
_WAITED_S = 100e-6
"""A clock wait longer than this held the vranks past the sandbox's arrival (not a mere call)."""


def to_device(rec: RecordedCollective, device: torch.device) -> RecordedCollective:
    def move(d):
        return {k: v.to(device) for k, v in d.items()}

    return dataclasses.replace(rec, inputs=move(rec.inputs), outputs=move(rec.outputs),
                               entry_partials=move(rec.entry_partials), subtree_partials=move(rec.subtree_partials))


class DeviceServer:
    """Lanes and per-channel serving of one replayer on one GPU."""

    def __init__(self, *, index: int, device_index: int, lanes: list[Lane], sandbox: frozenset[int],
                 store_factory: Callable[[], dist.Store], timeout_s: float, clock, records) -> None:
        self.index = index
        self.device = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
        self._cuda = self.device.type == "cuda"
        self.sandbox = sandbox
        self._lanes_planned = lanes
        self._store_factory = store_factory
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._clock = clock
        self._timed = not isinstance(clock, AsapClock)
        self._records = records
        """(channel, node) -> the op's records (per part), on the host."""
        self._pgs: dict[Lane, dist.ProcessGroup | IpcLane] = {}
        self.links: dict[Lane, LinkModel] = {}
        """CPU lanes: each lane's latency and bandwidth, measured when it opened (the transfer hold)."""
        self._on_device: dict[tuple, list[RecordedCollective]] = {}
        self._lock = threading.Lock()
        self.diverged: dict[int, list[dict]] = {}
        self.num_ops = 0
        self.num_recorded_outputs = 0
        """Parts of collectives answered with the recorded outputs, the ring not run (every input as recorded)."""
        self.num_transfer_holds = 0
        """CPU lanes: collectives whose outputs were held for the group's transfer (``_transfer_hold_s``)."""
        self.traffic_bytes = 0
        self.phase_s: dict[str, float] = {}
        """CPU seconds per phase of serving (records, recv, compute, clock, hold, send, sync)."""

    # -------------------------------------------------------------------------- connections

    def connect_all(self) -> None:
        """Open and warm up every lane (one thread each: the sandbox ranks open theirs in their own
        order, while the script creates its groups)."""
        self._set_device()
        errors: list[BaseException] = []

        def connect(lane: Lane) -> None:
            try:
                self._set_device()
                store = dist.PrefixStore(lane.prefix + "/", self._store_factory())
                if self._cuda and same_gpu(store, 1, self.device):  # NCCL refuses two ranks on one GPU
                    pg = IpcLane(store, 1, self.device)
                elif self._cuda:
                    opts = dist.ProcessGroupNCCL.Options()
                    opts._timeout = self._timeout
                    pg = dist.ProcessGroupNCCL(store, 1, 2, opts)
                else:
                    pg = dist.ProcessGroupGloo(store, 1, 2, self._timeout)
                probe = torch.zeros(1, device=self.device)
                pg.recv([probe], _SANDBOX_END, 0).wait()
                pg.send([probe], _SANDBOX_END, 0).wait()
                self._sync()
                link = None if self._cuda else probe_time(pg, _SANDBOX_END, self.device)
                with self._lock:
                    self._pgs[lane] = pg
                    if link is not None:
                        self.links[lane] = link
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=connect, args=(ln,), name=f"prism-lane-{ln.prefix}", daemon=True)
                   for ln in self._lanes_planned]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _set_device(self) -> None:
        if self._cuda:
            torch.cuda.set_device(self.device)

    def _sync(self) -> None:
        """Make the CPU wait for this thread's device work (nothing to wait for on CPU)."""
        if self._cuda:
            torch.cuda.current_stream().synchronize()

    def preload(self, channels: list[Channel]) -> None:
        """Every op's records on this GPU, before the first op."""
        for ch in channels:
            for node in ch.nodes:
                self._on_device[(ch.name, node.seq)] = [to_device(r, self.device) for r in self._records(ch, node)]
        self._sync()

    def _recs(self, ch: Channel, node: Node) -> list[RecordedCollective]:
        recs = self._on_device.pop((ch.name, node.seq), None)
        return recs if recs is not None else [to_device(r, self.device) for r in self._records(ch, node)]

    def _pg(self, ch: Channel, sandbox_rank: int) -> dist.ProcessGroup | IpcLane:
        lane = Lane(ch.group_id, sandbox_rank, ch.src, ch.dst)
        return self._pgs[lane]

    # ------------------------------------------------------------------------------ serving

    def serve(self, ch: Channel) -> None:
        self._set_device()
        # A stream per channel: the legacy default stream would serialize the channels.
        stream = torch.cuda.stream(torch.cuda.Stream(self.device)) if self._cuda else contextlib.nullcontext()
        with torch.no_grad(), stream:
            for node in ch.nodes:
                if ch.is_p2p:
                    self._message(ch, node)
                else:
                    self._collective(ch, node)
                with self._lock:
                    self.num_ops += 1

    def _message(self, ch: Channel, node: Node) -> None:
        recs = self._recs(ch, node)
        if ch.src in self.sandbox:  # the sandbox rank sends to a vrank: take the message
            messages = [rec.outputs.get(rec.peer, rec.inputs.get(rec.root)) for rec in recs]
            _check_recorded_size(ch, node, [(m.dtype, m.numel()) for m in messages])
            pg = self._pg(ch, ch.src)
            self._clock.wait_until_issue(ch.dst, node)  # an NCCL send completes once it is received
            works = []
            for m in messages:
                buf = torch.empty(m.numel(), dtype=m.dtype, device=self.device)
                works.append(pg.recv([buf], _SANDBOX_END, 0))
                self.traffic_bytes += buf.numel() * buf.element_size()
            for w in works:
                w.wait()
            self._completed(ch.dst, node)
            return
        pg = self._pg(ch, ch.dst)
        self._clock.wait_until_issue(ch.src, node)
        works = []
        for rec in recs:
            m = rec.outputs[rec.peer]
            works.append(pg.send([m.contiguous()], _SANDBOX_END, 0))
            self.traffic_bytes += m.numel() * m.element_size()
        for w in works:
            w.wait()
        self._completed(ch.src, node)

    def _completed(self, vrank: int, node: Node) -> None:
        if self._timed:  # the clock re-anchors on the real completion: the CPU must see it
            self._sync()
        self._clock.on_complete(vrank, node)

    def _took(self, phase: str, t0: float) -> float:
        t1 = time.perf_counter()
        with self._lock:
            self.phase_s[phase] = self.phase_s.get(phase, 0.0) + t1 - t0
        return t1

    def _collective(self, ch: Channel, node: Node) -> None:
        t = time.perf_counter()
        recs = self._recs(ch, node)
        t = self._took("records", t)
        n = len(ch.members)
        sb = [g for g, r in enumerate(ch.members) if r in self.sandbox]
        op = node.op
        root = ch.members.index(node.peer) if node.peer >= 0 and node.peer in ch.members else 0
        received: dict[tuple[int, int], torch.Tensor] = {}
        if node.rank in ch.members and sends_input(op, ch.members.index(node.rank), root):
            g = ch.members.index(node.rank)
            _check_recorded_size(ch, node, [(_dtype(rec), _input_numel(rec, g)) for rec in recs])
        works = []
        for g in sb:  # per lane in part order: what the sandbox rank sends, in its order
            if not sends_input(op, g, root):
                continue
            pg = self._pg(ch, ch.members[g])
            for i, rec in enumerate(recs):
                buf = torch.empty(_input_numel(rec, g), dtype=_dtype(rec), device=self.device)
                works.append(pg.recv([buf], _SANDBOX_END, 0))
                received[(i, g)] = buf
        for w in works:
            w.wait()
        t = arrived = self._took("recv", t)
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        vranks: set[int] = set()
        for i, rec in enumerate(recs):
            hosted = neighbor_ranks(rec)
            vranks |= {ch.members[v] for v in hosted}
            recorded = _recorded_outputs(rec, op, sb, root, {g: received.get((i, g)) for g in sb})
            if recorded is not None:
                outputs.update(((i, g), out) for g, out in recorded.items())
                with self._lock:
                    self.num_recorded_outputs += 1
                continue
            parties = []
            for g in sb:
                data = received.get((i, g))
                if data is None:  # nothing to contribute (broadcast non-root, barrier)
                    data = _placeholder(rec, g, self.device)
                elif rec.algo is Algo.DIRECT_ALL_TO_ALL:
                    data = data.view(sum(rec.in_splits[g]), rec.row_numel)
                kw = {}
                if rec.algo is Algo.DIRECT_ALL_TO_ALL:
                    kw = dict(in_splits=rec.in_splits[g], out_splits=rec.out_splits[g])
                party = SandboxParty(rec.algo, g, data, group_size=n, reduce_op=rec.reduce_op, root=rec.root,
                                     peer=rec.peer, recorded=rec, **kw)
                if party.diverged:
                    with self._lock:
                        self.diverged.setdefault(ch.members[g], []).append(
                            {"key": f"{ch.group_id}/{node.seq}", "op": op.value})
                parties.append(party)
            if hosted:
                parties.append(NeighborParty(rec, hosted, pruned_steps(rec)))
            run_in_process(parties)
            for g, party in zip(sb, parties, strict=False):
                out = party.output()
                if out is not None:
                    outputs[(i, g)] = out
        t = computed = self._took("compute", t)
        for v in sorted(vranks):
            self._clock.wait_until_issue(v, node)
        t = self._took("clock", t)
        hold_s = self._transfer_hold_s(ch, node, recs, sb, received, outputs)
        if hold_s > 0:
            # The transfer starts at the last arrival: the sandbox's input, or the vranks' issue
            # when the clock held them past it; the replayer's own work in between is inside it.
            start = t if t - computed > _WAITED_S else arrived
            if (left := start + hold_s - time.perf_counter()) > 0:
                time.sleep(left)
            t = self._took("hold", t)
            with self._lock:
                self.num_transfer_holds += 1
        works = []
        for g in sb:
            if not receives_output(op, g, root):
                continue
            pg = self._pg(ch, ch.members[g])
            for i in range(len(recs)):
                out = outputs[(i, g)].contiguous()
                works.append(pg.send([out], _SANDBOX_END, 0))
                self.traffic_bytes += out.numel() * out.element_size()
        for w in works:
            w.wait()
        t = self._took("send", t)
        if vranks and self._timed:
            self._sync()
        self._took("sync", t)
        for v in sorted(vranks):
            self._clock.on_complete(v, node)

    def _transfer_hold_s(self, ch: Channel, node: Node, recs: list[RecordedCollective], sb: list[int],
                         received: dict[tuple[int, int], torch.Tensor],
                         outputs: dict[tuple[int, int], torch.Tensor]) -> float:
        """CPU lanes: how long the outputs wait after the last arrival — the instance's transfer
        less the lane's own two messages, which the op takes anyway. The transfer is the timed
        graph's (an emulation follows its calibration) or, without one (a calibration slice), the
        whole-group algorithm's lock-stepped steps over a link like this lane (linkmodel.py).
        0 on GPU lanes (not measured there yet) and without a measured link."""
        if self._cuda or not sb:
            return 0.0
        link = self.links.get(Lane(ch.group_id, ch.members[sb[0]], ch.src, ch.dst))
        if link is None:
            return 0.0
        g = sb[0]
        lane_ns = sum(link.message_ns(t.numel() * t.element_size())
                      for i in range(len(recs)) for t in (received.get((i, g)), outputs.get((i, g))) if t is not None)
        timed = self._clock.transfer_ns(node)
        if timed is not None and timed >= 0:
            return max(0.0, (timed - lane_ns) / 1e9)
        ring_ns = sum(link.path_ns(critical_path(rec.algo, recorded_geometry(rec), g), _dtype(rec).itemsize)
                      for rec in recs)
        return max(0.0, (ring_ns - lane_ns) / 1e9)

    def close(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        for pg in self._pgs.values():
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - the run is over; a peer may be gone already
                log.debug("lane shutdown failed", exc_info=True)
        self._pgs.clear()


def _check_recorded_size(ch: Channel, node: Node, recorded: list[tuple[torch.dtype, int]]) -> None:
    """Before any transfer: the sandbox rank's input as the graph has it (the script's, on the path
    the structure run took) against the recorded data the vranks replay. They differ when the run
    that recorded the data took another path (a checkpoint it resumed from, other arguments or
    data); the transfer would fail on gloo's size check, or hang on NCCL. Only the rank whose
    nodes the channel holds is compared (a channel carries one sandbox member's nodes).
    ``recorded``: (dtype, numel) of each part's recorded input."""
    recorded_bytes = sum(numel * dtype.itemsize for dtype, numel in recorded)
    if recorded_bytes == node.size_bytes:
        return
    numel = sum(math.prod(s) for s in node.shapes)
    script = f"{normalize_dtype(node.dtype) or node.dtype}[{numel}]"
    data = " + ".join(describe(dtype, n) for dtype, n in recorded)
    what = f"rank {node.rank}: {node.op.value} on group {ch.group_id} seq {node.seq}"
    raise MismatchError(f"{recorded_on_another_path(what, script, data)}; its virtual peers cannot replay this op")


def _recorded_outputs(rec: RecordedCollective, op: CommOp, sb: list[int], root: int,
                      received: dict[int, torch.Tensor | None]) -> dict[int, torch.Tensor] | None:
    """The sandbox ranks' outputs without running the ring, when every input they sent is bitwise
    the recorded one: the vranks replay recorded values too, so the ring would compute what the
    collection returned to each of them (``rec.outputs``), bit for bit. None when an input deviates
    (the ring runs, and the op is flagged as diverged) or the record lacks what is needed. On a
    short step the in-process ring is the replayer's main cost per op (1.3 ms for an 8-rank
    16 KiB all-reduce on the 16-core machine), and each op of a group waits for the one before."""
    for g in sb:
        data = received[g]
        if data is None:
            continue
        want = rec.inputs.get(g)
        if want is None or not matches_record(data, want) or not same_bits(data, want):
            return None
    outs = {}
    for g in sb:
        if receives_output(op, g, root):
            out = rec.outputs.get(g)
            if out is None:
                return None
            outs[g] = out
    return outs


def _dtype(rec: RecordedCollective) -> torch.dtype:
    some = next(iter([*rec.inputs.values(), *rec.outputs.values()]), None)
    return torch.int32 if some is None else some.dtype


def _input_numel(rec: RecordedCollective, g: int) -> int:
    if rec.algo is Algo.DIRECT_ALL_TO_ALL:
        return sum(rec.in_splits[g]) * rec.row_numel
    if g in rec.inputs:
        return rec.inputs[g].numel()
    return rec.outputs[g].numel()


def _placeholder(rec: RecordedCollective, g: int, device: torch.device) -> torch.Tensor:
    if g in rec.outputs:
        return torch.zeros(rec.outputs[g].numel(), dtype=rec.outputs[g].dtype, device=device)
    return torch.zeros(1, dtype=torch.int32, device=device)


def lanes_of_replayer(graph, sandbox: frozenset[int], index: int, num_replayers: int) -> list[Lane]:
    """The lanes replayer ``index`` serves: those its sandbox ranks open towards it."""
    from prism.nccl_patches.vplan import device_lanes  # noqa: PLC0415

    members = {gid: g.ranks for gid, g in graph.groups.items()}
    lanes = []
    for s in sorted(sandbox):
        lanes += [ln for ln, rep in device_lanes(graph.nodes.get(s, ()), s, members, sandbox, num_replayers)
                  if rep == index]
    return lanes
