"""The rank worker's side of the coordinator service."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
import torch

from ._pb import coordinator_pb2 as pb
from ._pb import coordinator_pb2_grpc as pb_grpc
from .convert import header_to_pb, meta_from_pb
from .messages import SCHEMA_VERSION, CommHeader, FetchError
from .server import TOKEN_METADATA_KEY
from .tensors import tensor_chunks, tensors_from_bytes

__all__ = ["CoordinatorClient"]


class CoordinatorClient:
    def __init__(self, address: str, *, token: str = "") -> None:
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._meta = ((TOKEN_METADATA_KEY, token),) if token else ()

    def register(self, rank: int, pid: int) -> int:
        reply = self._stub.Register(pb.RegisterRequest(schema_version=SCHEMA_VERSION, rank=rank, pid=pid),
                                    metadata=self._meta, wait_for_ready=True, timeout=60)
        return reply.world_size

    def submit(self, header: CommHeader, inputs: Sequence[torch.Tensor]) -> bool:
        def chunks() -> Iterator[pb.SubmitChunk]:
            yield pb.SubmitChunk(header=header_to_pb(header))
            for data in tensor_chunks(inputs):
                yield pb.SubmitChunk(data=data)

        try:
            return self._stub.Submit(chunks(), metadata=self._meta).resolved
        except grpc.RpcError as e:
            raise FetchError(f"rank {header.rank}: the coordinator refused {header.op}: {e.details()}") from None

    def fetch(self, rank: int, op_index: int) -> list[torch.Tensor]:
        stream = self._stub.Fetch(pb.FetchRequest(rank=rank, op_index=op_index), metadata=self._meta)
        try:
            first = next(stream)
            head = first.header
            if head.error:
                raise FetchError(head.error)
            metas = [meta_from_pb(m) for m in head.outputs]
            return tensors_from_bytes(metas, (c.data for c in stream))
        except grpc.RpcError as e:
            raise FetchError(f"rank {rank}: lost the coordinator: {e.details()}") from None

    def finish(self, rank: int) -> None:
        self._stub.Finish(pb.FinishRequest(rank=rank), metadata=self._meta)

    def close(self) -> None:
        self._channel.close()
