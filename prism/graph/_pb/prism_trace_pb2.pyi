from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_KIND_UNSPECIFIED: _ClassVar[NodeKind]
    NODE_KIND_COMPUTE: _ClassVar[NodeKind]
    NODE_KIND_COLLECTIVE: _ClassVar[NodeKind]
    NODE_KIND_SEND: _ClassVar[NodeKind]
    NODE_KIND_RECV: _ClassVar[NodeKind]
    NODE_KIND_WAIT: _ClassVar[NodeKind]
    NODE_KIND_MARK: _ClassVar[NodeKind]

class CommOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMM_OP_UNSPECIFIED: _ClassVar[CommOp]
    COMM_OP_ALL_REDUCE: _ClassVar[CommOp]
    COMM_OP_ALL_GATHER: _ClassVar[CommOp]
    COMM_OP_REDUCE_SCATTER: _ClassVar[CommOp]
    COMM_OP_ALL_TO_ALL: _ClassVar[CommOp]
    COMM_OP_BROADCAST: _ClassVar[CommOp]
    COMM_OP_REDUCE: _ClassVar[CommOp]
    COMM_OP_GATHER: _ClassVar[CommOp]
    COMM_OP_SCATTER: _ClassVar[CommOp]
    COMM_OP_BARRIER: _ClassVar[CommOp]
    COMM_OP_SEND: _ClassVar[CommOp]
    COMM_OP_RECV: _ClassVar[CommOp]
NODE_KIND_UNSPECIFIED: NodeKind
NODE_KIND_COMPUTE: NodeKind
NODE_KIND_COLLECTIVE: NodeKind
NODE_KIND_SEND: NodeKind
NODE_KIND_RECV: NodeKind
NODE_KIND_WAIT: NodeKind
NODE_KIND_MARK: NodeKind
COMM_OP_UNSPECIFIED: CommOp
COMM_OP_ALL_REDUCE: CommOp
COMM_OP_ALL_GATHER: CommOp
COMM_OP_REDUCE_SCATTER: CommOp
COMM_OP_ALL_TO_ALL: CommOp
COMM_OP_BROADCAST: CommOp
COMM_OP_REDUCE: CommOp
COMM_OP_GATHER: CommOp
COMM_OP_SCATTER: CommOp
COMM_OP_BARRIER: CommOp
COMM_OP_SEND: CommOp
COMM_OP_RECV: CommOp

class Shape(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dims: _Optional[_Iterable[int]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("kind", "op", "group_id", "seq", "peer", "tag", "size_bytes", "dtype", "shapes", "out_shapes", "in_splits", "out_splits", "reduce_op", "is_async", "call_site", "target", "mark", "step", "start_ns", "duration_ns", "payload")
    KIND_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    OUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    IN_SPLITS_FIELD_NUMBER: _ClassVar[int]
    OUT_SPLITS_FIELD_NUMBER: _ClassVar[int]
    REDUCE_OP_FIELD_NUMBER: _ClassVar[int]
    IS_ASYNC_FIELD_NUMBER: _ClassVar[int]
    CALL_SITE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    kind: NodeKind
    op: CommOp
    group_id: str
    seq: int
    peer: int
    tag: int
    size_bytes: int
    dtype: str
    shapes: _containers.RepeatedCompositeFieldContainer[Shape]
    out_shapes: _containers.RepeatedCompositeFieldContainer[Shape]
    in_splits: _containers.RepeatedScalarFieldContainer[int]
    out_splits: _containers.RepeatedScalarFieldContainer[int]
    reduce_op: str
    is_async: bool
    call_site: str
    target: int
    mark: str
    step: int
    start_ns: int
    duration_ns: int
    payload: str
    def __init__(self, kind: _Optional[_Union[NodeKind, str]] = ..., op: _Optional[_Union[CommOp, str]] = ..., group_id: _Optional[str] = ..., seq: _Optional[int] = ..., peer: _Optional[int] = ..., tag: _Optional[int] = ..., size_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., shapes: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., out_shapes: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., in_splits: _Optional[_Iterable[int]] = ..., out_splits: _Optional[_Iterable[int]] = ..., reduce_op: _Optional[str] = ..., is_async: _Optional[bool] = ..., call_site: _Optional[str] = ..., target: _Optional[int] = ..., mark: _Optional[str] = ..., step: _Optional[int] = ..., start_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., payload: _Optional[str] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group_id", "ranks", "desc")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    desc: str
    def __init__(self, group_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., desc: _Optional[str] = ...) -> None: ...

class RankSummary(_message.Message):
    __slots__ = ("rank", "losses", "step_times_ns", "peak_memory_bytes", "memory_source", "exit_code", "measured_peak_memory_bytes")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMES_NS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    losses: _containers.RepeatedScalarFieldContainer[float]
    step_times_ns: _containers.RepeatedScalarFieldContainer[int]
    peak_memory_bytes: int
    memory_source: str
    exit_code: int
    measured_peak_memory_bytes: int
    def __init__(self, rank: _Optional[int] = ..., losses: _Optional[_Iterable[float]] = ..., step_times_ns: _Optional[_Iterable[int]] = ..., peak_memory_bytes: _Optional[int] = ..., memory_source: _Optional[str] = ..., exit_code: _Optional[int] = ..., measured_peak_memory_bytes: _Optional[int] = ...) -> None: ...

class RankFile(_message.Message):
    __slots__ = ("schema_version", "rank", "summary", "has_summary", "nodes", "nodes_sha256")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    HAS_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODES_SHA256_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    rank: int
    summary: RankSummary
    has_summary: bool
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    nodes_sha256: str
    def __init__(self, schema_version: _Optional[int] = ..., rank: _Optional[int] = ..., summary: _Optional[_Union[RankSummary, _Mapping]] = ..., has_summary: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., nodes_sha256: _Optional[str] = ...) -> None: ...

class RankFileRef(_message.Message):
    __slots__ = ("rank", "file_name", "sha256", "size_bytes", "num_nodes")
    RANK_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    file_name: str
    sha256: str
    size_bytes: int
    num_nodes: int
    def __init__(self, rank: _Optional[int] = ..., file_name: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., num_nodes: _Optional[int] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("rank_map", "group_map")
    class GroupMapEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RANK_MAP_FIELD_NUMBER: _ClassVar[int]
    GROUP_MAP_FIELD_NUMBER: _ClassVar[int]
    rank_map: _containers.RepeatedScalarFieldContainer[int]
    group_map: _containers.ScalarMap[str, str]
    def __init__(self, rank_map: _Optional[_Iterable[int]] = ..., group_map: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Templates(_message.Message):
    __slots__ = ("kind", "template_of", "replica_of", "replicas")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_OF_FIELD_NUMBER: _ClassVar[int]
    REPLICA_OF_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    template_of: _containers.RepeatedScalarFieldContainer[int]
    replica_of: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, kind: _Optional[str] = ..., template_of: _Optional[_Iterable[int]] = ..., replica_of: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("schema_version", "world_size", "kind", "job_name", "meta", "groups", "rank_files", "templates", "sha256")
    class MetaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RANK_FILES_FIELD_NUMBER: _ClassVar[int]
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    world_size: int
    kind: str
    job_name: str
    meta: _containers.ScalarMap[str, str]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    rank_files: _containers.RepeatedCompositeFieldContainer[RankFileRef]
    templates: Templates
    sha256: str
    def __init__(self, schema_version: _Optional[int] = ..., world_size: _Optional[int] = ..., kind: _Optional[str] = ..., job_name: _Optional[str] = ..., meta: _Optional[_Mapping[str, str]] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ..., rank_files: _Optional[_Iterable[_Union[RankFileRef, _Mapping]]] = ..., templates: _Optional[_Union[Templates, _Mapping]] = ..., sha256: _Optional[str] = ...) -> None: ...
