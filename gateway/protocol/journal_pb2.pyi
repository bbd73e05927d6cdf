from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("operations",)
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("epoch_started", "checkpoint", "append")
    EPOCH_STARTED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    epoch_started: EpochStarted
    checkpoint: Checkpoint
    append: Append
    def __init__(self, epoch_started: _Optional[_Union[EpochStarted, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., append: _Optional[_Union[Append, _Mapping]] = ...) -> None: ...

class EpochStarted(_message.Message):
    __slots__ = ("epoch", "started_at_ms", "software_version")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    started_at_ms: int
    software_version: str
    def __init__(self, epoch: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., software_version: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: bytes
    def __init__(self, snapshot: _Optional[bytes] = ...) -> None: ...

class Append(_message.Message):
    __slots__ = ("segment_id", "offset", "data")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset: int
    data: bytes
    def __init__(self, segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
