"""The transport between roles: the only package that imports grpc and generated code.

Roles see plain Python: :class:`CommHeader` and tensors. The coordinator serves a
:class:`CoordinatorHandler` with :class:`CoordinatorServer`; a rank worker talks to it with
:class:`CoordinatorClient`. Tensor bytes travel in chunks of at most ``MAX_CHUNK_BYTES``.
"""

import os

# Workers are forked while gRPC threads run; grpc's fork handlers are not needed (children exec).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from .client import CoordinatorClient
from .messages import SCHEMA_VERSION, CommHeader, FetchError, TensorMeta
from .server import CoordinatorHandler, CoordinatorServer
from .tensors import MAX_CHUNK_BYTES

__all__ = [
    "SCHEMA_VERSION",
    "MAX_CHUNK_BYTES",
    "CommHeader",
    "TensorMeta",
    "FetchError",
    "CoordinatorHandler",
    "CoordinatorServer",
    "CoordinatorClient",
]
