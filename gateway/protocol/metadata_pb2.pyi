from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_OUTCOME_UNSPECIFIED: _ClassVar[TransactionOutcome]
    TXN_COMMITTED: _ClassVar[TransactionOutcome]
    TXN_ABORTED: _ClassVar[TransactionOutcome]
    TXN_TIMED_OUT: _ClassVar[TransactionOutcome]
TXN_OUTCOME_UNSPECIFIED: TransactionOutcome
TXN_COMMITTED: TransactionOutcome
TXN_ABORTED: TransactionOutcome
TXN_TIMED_OUT: TransactionOutcome

class AttributeValue(_message.Message):
    __slots__ = ("id", "value", "removed")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    value: int
    removed: bool
    def __init__(self, id: _Optional[bytes] = ..., value: _Optional[int] = ..., removed: _Optional[bool] = ...) -> None: ...

class AttributeIndexRecord(_message.Message):
    __slots__ = ("root_offset", "root_length", "length", "start", "chunks")
    ROOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROOT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    root_offset: int
    root_length: int
    length: int
    start: int
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkRecord]
    def __init__(self, root_offset: _Optional[int] = ..., root_length: _Optional[int] = ..., length: _Optional[int] = ..., start: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[ChunkRecord, _Mapping]]] = ...) -> None: ...

class ChunkRecord(_message.Message):
    __slots__ = ("name", "start_offset", "length", "crc32c", "epoch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    start_offset: int
    length: int
    crc32c: int
    epoch: int
    def __init__(self, name: _Optional[str] = ..., start_offset: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class SegmentRecord(_message.Message):
    __slots__ = ("id", "name", "start_offset", "length", "storage_length", "sealed", "sealed_in_storage", "created_at_ms", "last_modified_ms", "attributes", "chunks", "event_index", "txn_parent", "txn_deadline_ms", "merged_into", "merge_offset", "attribute_index", "attributes_moved")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    STORAGE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SEALED_IN_STORAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_MS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TXN_PARENT_FIELD_NUMBER: _ClassVar[int]
    TXN_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    MERGED_INTO_FIELD_NUMBER: _ClassVar[int]
    MERGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    start_offset: int
    length: int
    storage_length: int
    sealed: bool
    sealed_in_storage: bool
    created_at_ms: int
    last_modified_ms: int
    attributes: _containers.RepeatedCompositeFieldContainer[AttributeValue]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkRecord]
    event_index: _containers.RepeatedScalarFieldContainer[int]
    txn_parent: str
    txn_deadline_ms: int
    merged_into: int
    merge_offset: int
    attribute_index: AttributeIndexRecord
    attributes_moved: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., start_offset: _Optional[int] = ..., length: _Optional[int] = ..., storage_length: _Optional[int] = ..., sealed: _Optional[bool] = ..., sealed_in_storage: _Optional[bool] = ..., created_at_ms: _Optional[int] = ..., last_modified_ms: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[AttributeValue, _Mapping]]] = ..., chunks: _Optional[_Iterable[_Union[ChunkRecord, _Mapping]]] = ..., event_index: _Optional[_Iterable[int]] = ..., txn_parent: _Optional[str] = ..., txn_deadline_ms: _Optional[int] = ..., merged_into: _Optional[int] = ..., merge_offset: _Optional[int] = ..., attribute_index: _Optional[_Union[AttributeIndexRecord, _Mapping]] = ..., attributes_moved: _Optional[bool] = ...) -> None: ...

class StreamRecord(_message.Message):
    __slots__ = ("name", "created_at_ms", "roll_size", "roll_age_ms", "retain_size", "retain_age_ms", "next_number", "codec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ROLL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROLL_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETAIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    created_at_ms: int
    roll_size: int
    roll_age_ms: int
    retain_size: int
    retain_age_ms: int
    next_number: int
    codec: int
    def __init__(self, name: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., roll_size: _Optional[int] = ..., roll_age_ms: _Optional[int] = ..., retain_size: _Optional[int] = ..., retain_age_ms: _Optional[int] = ..., next_number: _Optional[int] = ..., codec: _Optional[int] = ...) -> None: ...

class ContainerSnapshot(_message.Message):
    __slots__ = ("version", "next_segment_id", "segments", "streams", "txn_outcomes", "partial", "deleted_ids", "complete_from", "whole_pieces", "piece")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    TXN_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    DELETED_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FROM_FIELD_NUMBER: _ClassVar[int]
    WHOLE_PIECES_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    version: int
    next_segment_id: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentRecord]
    streams: _containers.RepeatedCompositeFieldContainer[StreamRecord]
    txn_outcomes: _containers.RepeatedCompositeFieldContainer[TransactionOutcomeRecord]
    partial: bool
    deleted_ids: _containers.RepeatedScalarFieldContainer[int]
    complete_from: int
    whole_pieces: int
    piece: int
    def __init__(self, version: _Optional[int] = ..., next_segment_id: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentRecord, _Mapping]]] = ..., streams: _Optional[_Iterable[_Union[StreamRecord, _Mapping]]] = ..., txn_outcomes: _Optional[_Iterable[_Union[TransactionOutcomeRecord, _Mapping]]] = ..., partial: _Optional[bool] = ..., deleted_ids: _Optional[_Iterable[int]] = ..., complete_from: _Optional[int] = ..., whole_pieces: _Optional[int] = ..., piece: _Optional[int] = ...) -> None: ...

class TransactionOutcomeRecord(_message.Message):
    __slots__ = ("name", "parent", "outcome", "segment", "offset", "length", "at_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    outcome: TransactionOutcome
    segment: str
    offset: int
    length: int
    at_ms: int
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., outcome: _Optional[_Union[TransactionOutcome, str]] = ..., segment: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., at_ms: _Optional[int] = ...) -> None: ...

class MetadataSnapshot(_message.Message):
    __slots__ = ("version", "node", "epoch", "created_at_ms", "software_version", "container", "delta_of", "delta_number")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    DELTA_OF_FIELD_NUMBER: _ClassVar[int]
    DELTA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    version: int
    node: str
    epoch: int
    created_at_ms: int
    software_version: str
    container: ContainerSnapshot
    delta_of: str
    delta_number: int
    def __init__(self, version: _Optional[int] = ..., node: _Optional[str] = ..., epoch: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., software_version: _Optional[str] = ..., container: _Optional[_Union[ContainerSnapshot, _Mapping]] = ..., delta_of: _Optional[str] = ..., delta_number: _Optional[int] = ...) -> None: ...
