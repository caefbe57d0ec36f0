from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessExit(_message.Message):
    __slots__ = ("key", "code")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    key: int
    code: int
    def __init__(self, key: _Optional[int] = ..., code: _Optional[int] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("role", "index", "node", "pid", "task", "exits", "started")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EXITS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    role: str
    index: int
    node: str
    pid: int
    task: int
    exits: _containers.RepeatedCompositeFieldContainer[ProcessExit]
    started: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, role: _Optional[str] = ..., index: _Optional[int] = ..., node: _Optional[str] = ..., pid: _Optional[int] = ..., task: _Optional[int] = ..., exits: _Optional[_Iterable[_Union[ProcessExit, _Mapping]]] = ..., started: _Optional[_Iterable[int]] = ...) -> None: ...

class StartProcess(_message.Message):
    __slots__ = ("key", "argv", "env", "log_path", "preload")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    PRELOAD_FIELD_NUMBER: _ClassVar[int]
    key: int
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    log_path: str
    preload: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[int] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., log_path: _Optional[str] = ..., preload: _Optional[_Iterable[str]] = ...) -> None: ...

class SignalProcess(_message.Message):
    __slots__ = ("key", "signal")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    key: int
    signal: int
    def __init__(self, key: _Optional[int] = ..., signal: _Optional[int] = ...) -> None: ...

class PollReply(_message.Message):
    __slots__ = ("starts", "signals", "stop", "stop_reason")
    STARTS_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    starts: _containers.RepeatedCompositeFieldContainer[StartProcess]
    signals: _containers.RepeatedCompositeFieldContainer[SignalProcess]
    stop: bool
    stop_reason: str
    def __init__(self, starts: _Optional[_Iterable[_Union[StartProcess, _Mapping]]] = ..., signals: _Optional[_Iterable[_Union[SignalProcess, _Mapping]]] = ..., stop: _Optional[bool] = ..., stop_reason: _Optional[str] = ...) -> None: ...
