from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorMeta(_message.Message):
    __slots__ = ("dtype", "shape", "size_bytes")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    size_bytes: int
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("schema_version", "rank", "pid")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    rank: int
    pid: int
    def __init__(self, schema_version: _Optional[int] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("schema_version", "world_size")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    world_size: int
    def __init__(self, schema_version: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class CommHeader(_message.Message):
    __slots__ = ("rank", "op_index", "op", "group_id", "group_ranks", "seq", "reduce_op", "root", "peer", "tag", "in_splits", "out_splits", "flat", "coalesced", "inputs", "outputs", "call_site")
    RANK_FIELD_NUMBER: _ClassVar[int]
    OP_INDEX_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_RANKS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REDUCE_OP_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    IN_SPLITS_FIELD_NUMBER: _ClassVar[int]
    OUT_SPLITS_FIELD_NUMBER: _ClassVar[int]
    FLAT_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    CALL_SITE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    op_index: int
    op: str
    group_id: str
    group_ranks: _containers.RepeatedScalarFieldContainer[int]
    seq: int
    reduce_op: str
    root: int
    peer: int
    tag: int
    in_splits: _containers.RepeatedScalarFieldContainer[int]
    out_splits: _containers.RepeatedScalarFieldContainer[int]
    flat: bool
    coalesced: bool
    inputs: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    call_site: str
    def __init__(self, rank: _Optional[int] = ..., op_index: _Optional[int] = ..., op: _Optional[str] = ..., group_id: _Optional[str] = ..., group_ranks: _Optional[_Iterable[int]] = ..., seq: _Optional[int] = ..., reduce_op: _Optional[str] = ..., root: _Optional[int] = ..., peer: _Optional[int] = ..., tag: _Optional[int] = ..., in_splits: _Optional[_Iterable[int]] = ..., out_splits: _Optional[_Iterable[int]] = ..., flat: _Optional[bool] = ..., coalesced: _Optional[bool] = ..., inputs: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., call_site: _Optional[str] = ...) -> None: ...

class SubmitChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: CommHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[CommHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("resolved",)
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    resolved: bool
    def __init__(self, resolved: _Optional[bool] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("rank", "op_index")
    RANK_FIELD_NUMBER: _ClassVar[int]
    OP_INDEX_FIELD_NUMBER: _ClassVar[int]
    rank: int
    op_index: int
    def __init__(self, rank: _Optional[int] = ..., op_index: _Optional[int] = ...) -> None: ...

class FetchHeader(_message.Message):
    __slots__ = ("outputs", "error", "slot")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    error: str
    slot: int
    def __init__(self, outputs: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., error: _Optional[str] = ..., slot: _Optional[int] = ...) -> None: ...

class FetchChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: FetchHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[FetchHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class FinishRequest(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    def __init__(self, rank: _Optional[int] = ...) -> None: ...

class FinishReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
