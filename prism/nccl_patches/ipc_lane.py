"""A lane between two processes on one GPU over CUDA IPC (the ``ipc`` device path).

NCCL refuses two ranks on one GPU, so a sandbox rank and the replayer that shares its GPU cannot
join a ProcessGroupNCCL. This lane gives them the same two-endpoint ``send``/``recv`` interface
(:class:`~prism.nccl_patches.vplan.Lane`) over device memory: the replayer (end 1) owns one
buffer with a ring of ``num_slots`` slots per direction and four 32-bit counters, the sandbox
rank (end 0) maps it once when the lane opens (``cudaIpcOpenMemHandle`` through torch's CUDA
tensor sharing, so the mapping is not in the sandbox allocator's statistics).

A message is cut into slot-sized chunks. Per chunk ``k`` the sender's lane stream waits until the
receiver has drained chunk ``k - num_slots`` of that direction, copies the chunk into its slot and
writes ``filled = k``; the receiver's lane stream waits for ``filled >= k``, copies the chunk out
and writes ``drained = k``. The waits and writes are CUDA stream memory operations
(``cuStreamWaitValue32`` / ``cuStreamWriteValue32``, ordered after the stream's earlier work with
a memory fence): the GPU's front end holds the stream, no SM spins and no CPU thread blocks, as a
lane's NCCL stream waits for its peer. Each op waits for the caller's current stream at enqueue
and returns a work whose ``wait()`` makes the caller's current stream wait for the transfer — the
CPU never blocks, as with ProcessGroupNCCL.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import pickle
import threading

import torch
import torch.distributed as dist

from prism.core.errors import PrismError

__all__ = ["IpcLane", "same_gpu", "DEFAULT_SLOT_BYTES", "DEFAULT_NUM_SLOTS"]

DEFAULT_SLOT_BYTES = 16 << 20
DEFAULT_NUM_SLOTS = 4
_HEADER_BYTES = 512
_WAIT_GEQ = 0x0
_WRITE_DEFAULT = 0x0


@functools.cache
def _driver() -> tuple:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise PrismError(f"ipc lane: cannot load the CUDA driver (libcuda.so.1): {e}") from e

    def fn(name: str):
        for symbol in (f"{name}_v2", name):
            try:
                f = getattr(lib, symbol)
            except AttributeError:
                continue
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            f.restype = ctypes.c_int
            return f
        raise PrismError(f"ipc lane: the CUDA driver has no {name}")

    err = lib.cuGetErrorString
    err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return fn("cuStreamWaitValue32"), fn("cuStreamWriteValue32"), err


def _check(code: int, what: str) -> None:
    if code != 0:
        text = ctypes.c_char_p()
        _driver()[2](code, ctypes.byref(text))
        raise PrismError(f"ipc lane: {what} failed: CUDA error {code} "
                         f"({(text.value or b'?').decode()})")


def _wait_value(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _check(_driver()[0](stream.cuda_stream, addr, value & 0xFFFFFFFF, _WAIT_GEQ), "cuStreamWaitValue32")


def _write_value(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _check(_driver()[1](stream.cuda_stream, addr, value & 0xFFFFFFFF, _WRITE_DEFAULT), "cuStreamWriteValue32")


def same_gpu(store: dist.Store, end: int, device: torch.device) -> bool:
    """Whether the two ends of a lane run on one physical GPU (each end publishes its GPU's UUID
    under ``store`` and reads the other's): then the lane is an :class:`IpcLane`, else NCCL."""
    if device.type != "cuda":
        return False
    store = dist.PrefixStore("gpu/", store)
    store.set(str(end), str(torch.cuda.get_device_properties(device).uuid))
    return store.get(str(1 - end)).decode() == str(torch.cuda.get_device_properties(device).uuid)


class _Work:
    """The end of one transfer on the lane's stream; keeps its tensors alive, as NCCL's work does."""

    def __init__(self, end: torch.cuda.Event, tensors: list[torch.Tensor]) -> None:
        self._end = end
        self._tensors = tensors

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        torch.cuda.current_stream().wait_event(self._end)
        return True

    def is_completed(self) -> bool:
        return self._end.query()


class IpcLane:
    """One end of a lane over CUDA IPC. ``end`` 1 (the replayer) allocates and publishes the
    buffer under ``store``; ``end`` 0 (the sandbox rank) maps it. ``peer``/``tag`` arguments are
    accepted for ProcessGroup compatibility and ignored (a lane has one peer and one order)."""

    def __init__(self, store: dist.Store, end: int, device: torch.device, *,
                 slot_bytes: int = DEFAULT_SLOT_BYTES, num_slots: int = DEFAULT_NUM_SLOTS) -> None:
        assert end in (0, 1) and device.type == "cuda"
        self.end = end
        self.device = device
        self._lock = threading.Lock()
        with torch.cuda.device(device):
            self.stream = torch.cuda.Stream(device)
            if end == 1:
                size = _HEADER_BYTES + 2 * num_slots * slot_bytes
                self._buffer = torch.zeros(size, dtype=torch.uint8, device=device)
                torch.cuda.synchronize(device)
                from torch.multiprocessing.reductions import reduce_tensor  # noqa: PLC0415

                _, args = reduce_tensor(self._buffer)
                store.set("ipc/buffer", pickle.dumps({"slot_bytes": slot_bytes, "num_slots": num_slots, "args": args}))
            else:
                meta = pickle.loads(store.get("ipc/buffer"))  # noqa: S301 - our own replayer's handle
                slot_bytes, num_slots = meta["slot_bytes"], meta["num_slots"]
                from torch.multiprocessing.reductions import rebuild_cuda_tensor  # noqa: PLC0415

                args = list(meta["args"])
                args[6] = device.index  # storage_device: the same physical GPU, this process's index
                self._buffer = rebuild_cuda_tensor(*args)
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        base = self._buffer.data_ptr()
        # direction d: 0 = end 0 -> end 1, 1 = end 1 -> end 0; counters (filled, drained) per direction
        self._filled = (base, base + 8)
        self._drained = (base + 4, base + 12)
        self._data = [self._buffer[_HEADER_BYTES + d * num_slots * slot_bytes:
                                   _HEADER_BYTES + (d + 1) * num_slots * slot_bytes] for d in (0, 1)]
        self._chunks = [0, 0]
        """Chunks enqueued so far per direction (sender's or receiver's count, by this end's role)."""

    def _chunk_ranges(self, nbytes: int) -> list[tuple[int, int]]:
        if nbytes == 0:
            return [(0, 0)]  # an empty message still passes a chunk: the peer's order stays in step
        return [(off, min(self.slot_bytes, nbytes - off)) for off in range(0, nbytes, self.slot_bytes)]

    def send(self, tensors: list[torch.Tensor], peer: int = 0, tag: int = 0) -> _Work:
        return self._enqueue(tensors, sending=True)

    def recv(self, tensors: list[torch.Tensor], peer: int = 0, tag: int = 0) -> _Work:
        return self._enqueue(tensors, sending=False)

    def _enqueue(self, tensors: list[torch.Tensor], *, sending: bool) -> _Work:
        (t,) = tensors
        if not t.is_contiguous():
            raise PrismError(f"ipc lane: a {'send' if sending else 'recv'} needs a contiguous tensor")
        d = self.end if sending else 1 - self.end
        flat = t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=self.device)
        ring = self._data[d]
        with self._lock, torch.cuda.device(self.device):
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for off, n in self._chunk_ranges(flat.numel()):
                    k = self._chunks[d] + 1
                    slot = ((k - 1) % self.num_slots) * self.slot_bytes
                    if sending:
                        if k > self.num_slots:
                            _wait_value(self.stream, self._drained[d], k - self.num_slots)
                        if n:
                            ring[slot:slot + n].copy_(flat[off:off + n], non_blocking=True)
                        _write_value(self.stream, self._filled[d], k)
                    else:
                        _wait_value(self.stream, self._filled[d], k)
                        if n:
                            flat[off:off + n].copy_(ring[slot:slot + n], non_blocking=True)
                        _write_value(self.stream, self._drained[d], k)
                    self._chunks[d] = k
                end = torch.cuda.Event()
                end.record(self.stream)
        return _Work(end, [t])

    def shutdown(self) -> None:
        with torch.cuda.device(self.device):
            self.stream.synchronize()
        self._data = []
        self._buffer = None
