"""The coordinator's gRPC server: translates RPCs into calls on a plain-Python handler.

Binds loopback by default (port 0 picks a free port). For a multi-node run bind ``0.0.0.0:PORT``
and set a token: every call must then carry it in the ``prism-token`` metadata.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Protocol

import grpc
import torch

from ._pb import coordinator_pb2 as pb
from ._pb import coordinator_pb2_grpc as pb_grpc
from .convert import header_from_pb, meta_to_pb
from .messages import SCHEMA_VERSION, CommHeader, FetchError, TensorMeta
from .tensors import tensor_chunks, tensors_from_bytes

__all__ = ["CoordinatorHandler", "CoordinatorServer", "TOKEN_METADATA_KEY"]

log = logging.getLogger(__name__)

TOKEN_METADATA_KEY = "prism-token"


class CoordinatorHandler(Protocol):
    def register(self, rank: int, pid: int) -> int:
        """Returns the world size."""

    def submit(self, header: CommHeader, inputs: list[torch.Tensor]) -> bool:
        """Returns whether the op's outputs are already known."""

    def fetch(self, rank: int, op_index: int) -> tuple[int, list[torch.Tensor]]:
        """Blocks until the outputs are ready and the rank holds a slot; (slot, outputs).
        Raises :class:`FetchError` when the op cannot complete."""

    def finish(self, rank: int) -> None: ...


class _TokenCheck(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

        def deny(_request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong prism-token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        meta = dict(handler_call_details.invocation_metadata or ())
        if meta.get(TOKEN_METADATA_KEY) != self._token:
            return self._deny
        return continuation(handler_call_details)


class _Servicer(pb_grpc.CoordinatorServicer):
    def __init__(self, handler: CoordinatorHandler) -> None:
        self._h = handler

    def Register(self, request, context):
        if request.schema_version != SCHEMA_VERSION:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"worker speaks schema {request.schema_version}, coordinator {SCHEMA_VERSION}")
        world = self._h.register(request.rank, request.pid)
        return pb.RegisterReply(schema_version=SCHEMA_VERSION, world_size=world)

    def Submit(self, request_iterator, context):
        first = next(request_iterator)
        if first.WhichOneof("body") != "header":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Submit must start with a header")
        header = header_from_pb(first.header)
        inputs = tensors_from_bytes(header.inputs, (c.data for c in request_iterator))
        try:
            resolved = self._h.submit(header, inputs)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.SubmitReply(resolved=resolved)

    def Fetch(self, request, context):
        try:
            slot, outputs = self._h.fetch(request.rank, request.op_index)
        except FetchError as e:
            yield pb.FetchChunk(header=pb.FetchHeader(error=str(e)))
            return
        metas = [meta_to_pb(TensorMeta.of(t)) for t in outputs]
        yield pb.FetchChunk(header=pb.FetchHeader(outputs=metas, slot=slot))
        for data in tensor_chunks(outputs):
            yield pb.FetchChunk(data=data)

    def Finish(self, request, context):
        self._h.finish(request.rank)
        return pb.FinishReply()


def exclusive_server(executor: futures.Executor, interceptors: list) -> grpc.Server:
    """A gRPC server without SO_REUSEPORT (gRPC's default): a second server on a fixed port (another
    run's head, or one left behind) would otherwise bind it too and take some of its connections,
    which it then refuses for their token."""
    return grpc.server(executor, interceptors=interceptors, options=[("grpc.so_reuseport", 0)])


def bind_port(server: grpc.Server, bind: str, who: str) -> int:
    """``server``'s port on ``bind``; OSError naming it when it cannot have it."""
    try:
        port = server.add_insecure_port(bind)
    except RuntimeError:  # grpcio raises where older versions returned 0
        port = 0
    if port == 0:
        raise OSError(f"{who}: cannot bind {bind}: the port is in use")
    return port


class CoordinatorServer:
    """A running gRPC server for one handler. ``address`` is what workers dial."""

    def __init__(self, handler: CoordinatorHandler, *, bind: str = "127.0.0.1:0", token: str = "",
                 max_workers: int = 64) -> None:
        interceptors = [_TokenCheck(token)] if token else []
        self._server = exclusive_server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="coord"), interceptors)
        pb_grpc.add_CoordinatorServicer_to_server(_Servicer(handler), self._server)
        port = bind_port(self._server, bind, "coordinator")
        host = bind.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            import socket

            host = socket.gethostname()
        self.address = f"{host}:{port}"
        self.port = port
        self._server.start()
        log.info("coordinator listening on %s", self.address)

    def stop(self, grace_s: float = 0.5) -> None:
        self._server.stop(grace_s).wait()
