"""The physical transport: point-to-point messages between sandbox ranks and vrank endpoints.

One :class:`Transport` serves one logical group (as one NCCL communicator does): its
*endpoints* are the processes that take part — each sandbox rank of the group and each replayer
that hosts neighbor vranks of it — and ``endpoint_of`` maps every group rank that has a live
endpoint to its endpoint index. The process group is built directly
(``ProcessGroupGloo``/``ProcessGroupNCCL`` constructors on a prefixed store), so it never touches
the script's logical default group. Only ``send``/``recv`` are used.

Every message is counted per directed logical link ``(src group rank, dst group rank)``: bytes and
messages (one message per algorithm step), on the side that sends and on the side that receives.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping

import torch
import torch.distributed as dist

from prism.core.errors import PrismError

from .schedule import LinkTraffic

__all__ = ["Transport"]

log = logging.getLogger(__name__)


class _StagedRecv:
    """A gloo recv into a host buffer that lands in the caller's CUDA buffer on ``wait``."""

    def __init__(self, work, staging: torch.Tensor, target: torch.Tensor) -> None:
        self._work, self._staging, self._target = work, staging, target

    def wait(self, timeout=None) -> bool:
        done = self._work.wait(timeout) if timeout is not None else self._work.wait()
        with torch.no_grad():  # a pipeline's recv buffer is a leaf that requires grad
            self._target.copy_(self._staging)
        return done


class Transport:
    """P2P over a directly built process group, with per-link counters."""

    def __init__(self, pg: dist.ProcessGroup, endpoint: int, endpoint_of: Mapping[int, int]) -> None:
        self.pg = pg
        self.endpoint = endpoint
        self.endpoint_of = dict(endpoint_of)
        self._traffic: dict[tuple[int, int], list[int]] = {}
        """(src, dst) -> [bytes, messages]: mutable counters, as this runs once per message."""
        self._gloo = isinstance(pg, dist.ProcessGroupGloo)
        """gloo moves CPU memory only: CUDA tensors (several sandbox ranks sharing one GPU, where NCCL
        refuses) travel through host staging buffers."""

    @classmethod
    def connect(
        cls,
        store: dist.Store,
        endpoint: int,
        num_endpoints: int,
        endpoint_of: Mapping[int, int],
        *,
        device: str = "cpu",
        timeout_s: float = 120.0,
        prefix: str = "prism/transport",
    ) -> Transport:
        """Join the transport as endpoint ``endpoint`` of ``num_endpoints`` (all call this with
        the same store, prefix and mapping). ``device`` ``cuda`` builds a ProcessGroupNCCL."""
        if not 0 <= endpoint < num_endpoints:
            raise PrismError(f"transport {prefix}: endpoint {endpoint} outside 0..{num_endpoints - 1}")
        bad = sorted(r for r, e in endpoint_of.items() if not 0 <= e < num_endpoints)
        if bad:
            raise PrismError(f"transport {prefix}: group ranks {bad} map to no endpoint of {num_endpoints}")
        timeout = datetime.timedelta(seconds=timeout_s)
        scoped = dist.PrefixStore(prefix + "/", store)
        if device.startswith("cuda"):
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(scoped, endpoint, num_endpoints, opts)
        else:
            pg = dist.ProcessGroupGloo(scoped, endpoint, num_endpoints, timeout)
        log.debug("transport %s: endpoint %d/%d up", prefix, endpoint, num_endpoints)
        return cls(pg, endpoint, endpoint_of)

    def _peer(self, rank: int) -> int:
        if rank not in self.endpoint_of:
            raise PrismError(f"transport: group rank {rank} has no endpoint (a pruned vrank was addressed)")
        return self.endpoint_of[rank]

    def _count(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        counts = self._traffic.get((src, dst))
        if counts is None:
            counts = self._traffic[(src, dst)] = [0, 0]
        counts[0] += tensor.nbytes
        counts[1] += 1

    def send(self, tensor: torch.Tensor, src: int, dst: int, tag: int) -> dist.Work:
        """Send group rank ``src``'s message to group rank ``dst`` (asynchronous)."""
        assert self.endpoint_of.get(src) == self.endpoint, f"group rank {src} is not hosted by endpoint {self.endpoint}"
        self._count(src, dst, tensor)
        if self._gloo and tensor.is_cuda:
            tensor = tensor.cpu()
        if not tensor.is_contiguous():  # a call of its own: each op through the dispatcher costs µs per message
            tensor = tensor.contiguous()
        return self.pg.send([tensor], self._peer(dst), tag)

    def recv(self, buffer: torch.Tensor, src: int, dst: int, tag: int) -> dist.Work:
        """Receive into ``buffer`` (contiguous) group rank ``src``'s message for ``dst``."""
        assert self.endpoint_of.get(dst) == self.endpoint, f"group rank {dst} is not hosted by endpoint {self.endpoint}"
        assert buffer.is_contiguous()
        self._count(src, dst, buffer)
        if self._gloo and buffer.is_cuda:
            staging = torch.empty(buffer.shape, dtype=buffer.dtype)
            return _StagedRecv(self.pg.recv([staging], self._peer(src), tag), staging, buffer)
        return self.pg.recv([buffer], self._peer(src), tag)

    @property
    def posts_without_blocking(self) -> bool:
        """Posting a send or a receive never blocks the caller (gloo); NCCL's point-to-point ops on
        one stream run in the order posted, so a batch of them to several peers can deadlock."""
        return self._gloo

    def traffic(self) -> dict[tuple[int, int], LinkTraffic]:
        """Bytes and messages per directed link this endpoint sent or received so far."""
        return {k: LinkTraffic(b, m) for k, (b, m) in self._traffic.items()}

    def reset_traffic(self) -> None:
        self._traffic.clear()

    def close(self) -> None:
        if isinstance(self.pg, getattr(dist, "ProcessGroupNCCL", ())):
            self.pg.shutdown()
        self.pg = None  # type: ignore[assignment]
