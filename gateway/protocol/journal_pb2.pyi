from gateway.protocol import metadata_pb2 as _metadata_pb2
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
    __slots__ = ("epoch_started", "checkpoint", "append", "create_segment", "seal_segment", "truncate_segment", "delete_segment", "update_attributes", "chunk_added", "storage_sealed", "merge_segment", "merge_completed", "set_stream", "delete_stream", "attribute_index_updated", "chunks_replaced")
    EPOCH_STARTED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    CREATE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SEAL_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DELETE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ADDED_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SEALED_FIELD_NUMBER: _ClassVar[int]
    MERGE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    MERGE_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    SET_STREAM_FIELD_NUMBER: _ClassVar[int]
    DELETE_STREAM_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_INDEX_UPDATED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_REPLACED_FIELD_NUMBER: _ClassVar[int]
    epoch_started: EpochStarted
    checkpoint: Checkpoint
    append: Append
    create_segment: CreateSegment
    seal_segment: SealSegment
    truncate_segment: TruncateSegment
    delete_segment: DeleteSegment
    update_attributes: UpdateAttributes
    chunk_added: ChunkAdded
    storage_sealed: StorageSealed
    merge_segment: MergeSegment
    merge_completed: MergeCompleted
    set_stream: SetStream
    delete_stream: DeleteStream
    attribute_index_updated: AttributeIndexUpdated
    chunks_replaced: ChunksReplaced
    def __init__(self, epoch_started: _Optional[_Union[EpochStarted, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., append: _Optional[_Union[Append, _Mapping]] = ..., create_segment: _Optional[_Union[CreateSegment, _Mapping]] = ..., seal_segment: _Optional[_Union[SealSegment, _Mapping]] = ..., truncate_segment: _Optional[_Union[TruncateSegment, _Mapping]] = ..., delete_segment: _Optional[_Union[DeleteSegment, _Mapping]] = ..., update_attributes: _Optional[_Union[UpdateAttributes, _Mapping]] = ..., chunk_added: _Optional[_Union[ChunkAdded, _Mapping]] = ..., storage_sealed: _Optional[_Union[StorageSealed, _Mapping]] = ..., merge_segment: _Optional[_Union[MergeSegment, _Mapping]] = ..., merge_completed: _Optional[_Union[MergeCompleted, _Mapping]] = ..., set_stream: _Optional[_Union[SetStream, _Mapping]] = ..., delete_stream: _Optional[_Union[DeleteStream, _Mapping]] = ..., attribute_index_updated: _Optional[_Union[AttributeIndexUpdated, _Mapping]] = ..., chunks_replaced: _Optional[_Union[ChunksReplaced, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("segment_id", "offset", "attributes", "at_ms", "data")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset: int
    attributes: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AttributeValue]
    at_ms: int
    data: bytes
    def __init__(self, segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_metadata_pb2.AttributeValue, _Mapping]]] = ..., at_ms: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CreateSegment(_message.Message):
    __slots__ = ("segment_id", "name", "created_at_ms", "attributes", "txn_parent", "txn_deadline_ms", "attributes_from")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    TXN_PARENT_FIELD_NUMBER: _ClassVar[int]
    TXN_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FROM_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    name: str
    created_at_ms: int
    attributes: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AttributeValue]
    txn_parent: str
    txn_deadline_ms: int
    attributes_from: int
    def __init__(self, segment_id: _Optional[int] = ..., name: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_metadata_pb2.AttributeValue, _Mapping]]] = ..., txn_parent: _Optional[str] = ..., txn_deadline_ms: _Optional[int] = ..., attributes_from: _Optional[int] = ...) -> None: ...

class SealSegment(_message.Message):
    __slots__ = ("segment_id", "at_ms")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    at_ms: int
    def __init__(self, segment_id: _Optional[int] = ..., at_ms: _Optional[int] = ...) -> None: ...

class TruncateSegment(_message.Message):
    __slots__ = ("segment_id", "offset", "at_ms")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset: int
    at_ms: int
    def __init__(self, segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., at_ms: _Optional[int] = ...) -> None: ...

class DeleteSegment(_message.Message):
    __slots__ = ("segment_id", "txn_timed_out", "at_ms")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TXN_TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    txn_timed_out: bool
    at_ms: int
    def __init__(self, segment_id: _Optional[int] = ..., txn_timed_out: _Optional[bool] = ..., at_ms: _Optional[int] = ...) -> None: ...

class UpdateAttributes(_message.Message):
    __slots__ = ("segment_id", "attributes", "at_ms")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    attributes: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AttributeValue]
    at_ms: int
    def __init__(self, segment_id: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_metadata_pb2.AttributeValue, _Mapping]]] = ..., at_ms: _Optional[int] = ...) -> None: ...

class ChunkAdded(_message.Message):
    __slots__ = ("segment_id", "chunk", "extends_last")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_LAST_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    chunk: _metadata_pb2.ChunkRecord
    extends_last: bool
    def __init__(self, segment_id: _Optional[int] = ..., chunk: _Optional[_Union[_metadata_pb2.ChunkRecord, _Mapping]] = ..., extends_last: _Optional[bool] = ...) -> None: ...

class AttributeIndexUpdated(_message.Message):
    __slots__ = ("segment_id", "root_offset", "root_length", "length", "start", "chunk", "through_seq")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROOT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    THROUGH_SEQ_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    root_offset: int
    root_length: int
    length: int
    start: int
    chunk: _metadata_pb2.ChunkRecord
    through_seq: int
    def __init__(self, segment_id: _Optional[int] = ..., root_offset: _Optional[int] = ..., root_length: _Optional[int] = ..., length: _Optional[int] = ..., start: _Optional[int] = ..., chunk: _Optional[_Union[_metadata_pb2.ChunkRecord, _Mapping]] = ..., through_seq: _Optional[int] = ...) -> None: ...

class StorageSealed(_message.Message):
    __slots__ = ("segment_id",)
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    def __init__(self, segment_id: _Optional[int] = ...) -> None: ...

class MergeSegment(_message.Message):
    __slots__ = ("target_id", "source_id", "offset", "attributes", "at_ms")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    source_id: int
    offset: int
    attributes: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AttributeValue]
    at_ms: int
    def __init__(self, target_id: _Optional[int] = ..., source_id: _Optional[int] = ..., offset: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_metadata_pb2.AttributeValue, _Mapping]]] = ..., at_ms: _Optional[int] = ...) -> None: ...

class MergeCompleted(_message.Message):
    __slots__ = ("target_id", "source_id")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    source_id: int
    def __init__(self, target_id: _Optional[int] = ..., source_id: _Optional[int] = ...) -> None: ...

class ChunksReplaced(_message.Message):
    __slots__ = ("segment_id", "replaced", "chunk")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    replaced: _containers.RepeatedScalarFieldContainer[str]
    chunk: _metadata_pb2.ChunkRecord
    def __init__(self, segment_id: _Optional[int] = ..., replaced: _Optional[_Iterable[str]] = ..., chunk: _Optional[_Union[_metadata_pb2.ChunkRecord, _Mapping]] = ...) -> None: ...

class SetStream(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: _metadata_pb2.StreamRecord
    def __init__(self, stream: _Optional[_Union[_metadata_pb2.StreamRecord, _Mapping]] = ...) -> None: ...

class DeleteStream(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
