from gateway.protocol import metadata_pb2 as _metadata_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    PROTOCOL_VERSION_1: _ClassVar[ProtocolVersion]

class StreamAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_GET: _ClassVar[StreamAction]
    STREAM_CREATE: _ClassVar[StreamAction]
    STREAM_SET: _ClassVar[StreamAction]
    STREAM_DELETE: _ClassVar[StreamAction]
    STREAM_LIST: _ClassVar[StreamAction]
    STREAM_ROLL: _ClassVar[StreamAction]

class TransactionAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_BEGIN: _ClassVar[TransactionAction]
    TXN_COMMIT: _ClassVar[TransactionAction]
    TXN_ABORT: _ClassVar[TransactionAction]

class EventCodec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_RAW: _ClassVar[EventCodec]
    CODEC_LINES: _ClassVar[EventCodec]
    CODEC_FRAMED: _ClassVar[EventCodec]

class AttributeVerb(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLACE: _ClassVar[AttributeVerb]
    REPLACE_IF_GREATER: _ClassVar[AttributeVerb]
    REPLACE_IF_EQUALS: _ClassVar[AttributeVerb]
    ACCUMULATE: _ClassVar[AttributeVerb]
    REMOVE: _ClassVar[AttributeVerb]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERNAL: _ClassVar[ErrorCode]
    SEGMENT_NOT_FOUND: _ClassVar[ErrorCode]
    SEGMENT_EXISTS: _ClassVar[ErrorCode]
    SEGMENT_SEALED: _ClassVar[ErrorCode]
    BAD_OFFSET: _ClassVar[ErrorCode]
    CONDITIONAL_CHECK_FAILED: _ClassVar[ErrorCode]
    BAD_ATTRIBUTE_UPDATE: _ClassVar[ErrorCode]
    INVALID_NAME: _ClassVar[ErrorCode]
    TOO_LARGE: _ClassVar[ErrorCode]
    OVERLOADED: _ClassVar[ErrorCode]
    UNAUTHORIZED: _ClassVar[ErrorCode]
    MALFORMED: _ClassVar[ErrorCode]
    UNSUPPORTED: _ClassVar[ErrorCode]
    LIMIT_EXCEEDED: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
    BAD_REQUEST: _ClassVar[ErrorCode]
    SEGMENT_TRUNCATED: _ClassVar[ErrorCode]
    TIER2_UNAVAILABLE: _ClassVar[ErrorCode]
    NOT_OWNER: _ClassVar[ErrorCode]
    OWNER_DOWN: _ClassVar[ErrorCode]
    NOT_A_TRANSACTION: _ClassVar[ErrorCode]
    TRANSACTION_TIMED_OUT: _ClassVar[ErrorCode]
    TRANSACTION_ABORTED: _ClassVar[ErrorCode]
    TRANSACTION_COMMITTED: _ClassVar[ErrorCode]
    REPLICA_FENCED: _ClassVar[ErrorCode]
    REPLICA_GAP: _ClassVar[ErrorCode]
    NO_QUORUM: _ClassVar[ErrorCode]
PROTOCOL_VERSION_UNSPECIFIED: ProtocolVersion
PROTOCOL_VERSION_1: ProtocolVersion
STREAM_GET: StreamAction
STREAM_CREATE: StreamAction
STREAM_SET: StreamAction
STREAM_DELETE: StreamAction
STREAM_LIST: StreamAction
STREAM_ROLL: StreamAction
TXN_BEGIN: TransactionAction
TXN_COMMIT: TransactionAction
TXN_ABORT: TransactionAction
CODEC_RAW: EventCodec
CODEC_LINES: EventCodec
CODEC_FRAMED: EventCodec
REPLACE: AttributeVerb
REPLACE_IF_GREATER: AttributeVerb
REPLACE_IF_EQUALS: AttributeVerb
ACCUMULATE: AttributeVerb
REMOVE: AttributeVerb
INTERNAL: ErrorCode
SEGMENT_NOT_FOUND: ErrorCode
SEGMENT_EXISTS: ErrorCode
SEGMENT_SEALED: ErrorCode
BAD_OFFSET: ErrorCode
CONDITIONAL_CHECK_FAILED: ErrorCode
BAD_ATTRIBUTE_UPDATE: ErrorCode
INVALID_NAME: ErrorCode
TOO_LARGE: ErrorCode
OVERLOADED: ErrorCode
UNAUTHORIZED: ErrorCode
MALFORMED: ErrorCode
UNSUPPORTED: ErrorCode
LIMIT_EXCEEDED: ErrorCode
UNAVAILABLE: ErrorCode
BAD_REQUEST: ErrorCode
SEGMENT_TRUNCATED: ErrorCode
TIER2_UNAVAILABLE: ErrorCode
NOT_OWNER: ErrorCode
OWNER_DOWN: ErrorCode
NOT_A_TRANSACTION: ErrorCode
TRANSACTION_TIMED_OUT: ErrorCode
TRANSACTION_ABORTED: ErrorCode
TRANSACTION_COMMITTED: ErrorCode
REPLICA_FENCED: ErrorCode
REPLICA_GAP: ErrorCode
NO_QUORUM: ErrorCode

class Request(_message.Message):
    __slots__ = ("request_id", "hello", "create", "append", "seal", "truncate", "delete", "update_attributes", "get_info", "list", "get_attributes", "read", "flush", "fsck", "export_metadata", "get_record", "cluster", "stream", "transaction", "replica_write", "replica_fence", "replica_read", "changes", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    GET_INFO_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    GET_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    FSCK_FIELD_NUMBER: _ClassVar[int]
    EXPORT_METADATA_FIELD_NUMBER: _ClassVar[int]
    GET_RECORD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_WRITE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FENCE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_READ_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    hello: Hello
    create: CreateSegmentRequest
    append: AppendRequest
    seal: SealRequest
    truncate: TruncateRequest
    delete: DeleteRequest
    update_attributes: UpdateAttributesRequest
    get_info: GetInfoRequest
    list: ListSegmentsRequest
    get_attributes: GetAttributesRequest
    read: ReadRequest
    flush: FlushRequest
    fsck: FsckRequest
    export_metadata: ExportMetadataRequest
    get_record: GetRecordRequest
    cluster: ClusterRequest
    stream: StreamRequest
    transaction: TransactionRequest
    replica_write: ReplicaWriteRequest
    replica_fence: ReplicaFenceRequest
    replica_read: ReplicaReadRequest
    changes: ChangesRequest
    status: StatusRequest
    def __init__(self, request_id: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., create: _Optional[_Union[CreateSegmentRequest, _Mapping]] = ..., append: _Optional[_Union[AppendRequest, _Mapping]] = ..., seal: _Optional[_Union[SealRequest, _Mapping]] = ..., truncate: _Optional[_Union[TruncateRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., update_attributes: _Optional[_Union[UpdateAttributesRequest, _Mapping]] = ..., get_info: _Optional[_Union[GetInfoRequest, _Mapping]] = ..., list: _Optional[_Union[ListSegmentsRequest, _Mapping]] = ..., get_attributes: _Optional[_Union[GetAttributesRequest, _Mapping]] = ..., read: _Optional[_Union[ReadRequest, _Mapping]] = ..., flush: _Optional[_Union[FlushRequest, _Mapping]] = ..., fsck: _Optional[_Union[FsckRequest, _Mapping]] = ..., export_metadata: _Optional[_Union[ExportMetadataRequest, _Mapping]] = ..., get_record: _Optional[_Union[GetRecordRequest, _Mapping]] = ..., cluster: _Optional[_Union[ClusterRequest, _Mapping]] = ..., stream: _Optional[_Union[StreamRequest, _Mapping]] = ..., transaction: _Optional[_Union[TransactionRequest, _Mapping]] = ..., replica_write: _Optional[_Union[ReplicaWriteRequest, _Mapping]] = ..., replica_fence: _Optional[_Union[ReplicaFenceRequest, _Mapping]] = ..., replica_read: _Optional[_Union[ReplicaReadRequest, _Mapping]] = ..., changes: _Optional[_Union[ChangesRequest, _Mapping]] = ..., status: _Optional[_Union[StatusRequest, _Mapping]] = ...) -> None: ...

class ReplicaWriteRequest(_message.Message):
    __slots__ = ("source", "epoch", "first_sequence", "frames", "truncate_before", "start", "caught_up", "drop_epochs_before", "seed_epoch", "seed_header")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    DROP_EPOCHS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SEED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEED_HEADER_FIELD_NUMBER: _ClassVar[int]
    source: str
    epoch: int
    first_sequence: int
    frames: bytes
    truncate_before: int
    start: bool
    caught_up: bool
    drop_epochs_before: int
    seed_epoch: int
    seed_header: bytes
    def __init__(self, source: _Optional[str] = ..., epoch: _Optional[int] = ..., first_sequence: _Optional[int] = ..., frames: _Optional[bytes] = ..., truncate_before: _Optional[int] = ..., start: _Optional[bool] = ..., caught_up: _Optional[bool] = ..., drop_epochs_before: _Optional[int] = ..., seed_epoch: _Optional[int] = ..., seed_header: _Optional[bytes] = ...) -> None: ...

class ReplicaFenceRequest(_message.Message):
    __slots__ = ("source", "epoch")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    source: str
    epoch: int
    def __init__(self, source: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReplicaReadRequest(_message.Message):
    __slots__ = ("source", "epoch", "from_sequence", "max_bytes")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    source: str
    epoch: int
    from_sequence: int
    max_bytes: int
    def __init__(self, source: _Optional[str] = ..., epoch: _Optional[int] = ..., from_sequence: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReplicaWriteResponse(_message.Message):
    __slots__ = ("next_sequence",)
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    next_sequence: int
    def __init__(self, next_sequence: _Optional[int] = ...) -> None: ...

class ReplicaLogInfo(_message.Message):
    __slots__ = ("epoch", "start", "next", "caught_up")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start: int
    next: int
    caught_up: bool
    def __init__(self, epoch: _Optional[int] = ..., start: _Optional[int] = ..., next: _Optional[int] = ..., caught_up: _Optional[bool] = ...) -> None: ...

class ReplicaHoldings(_message.Message):
    __slots__ = ("node", "fenced_below", "logs")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FENCED_BELOW_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    node: str
    fenced_below: int
    logs: _containers.RepeatedCompositeFieldContainer[ReplicaLogInfo]
    def __init__(self, node: _Optional[str] = ..., fenced_below: _Optional[int] = ..., logs: _Optional[_Iterable[_Union[ReplicaLogInfo, _Mapping]]] = ...) -> None: ...

class ReplicaFrames(_message.Message):
    __slots__ = ("frames", "next_sequence", "end")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    next_sequence: int
    end: bool
    def __init__(self, frames: _Optional[bytes] = ..., next_sequence: _Optional[int] = ..., end: _Optional[bool] = ...) -> None: ...

class StreamPolicy(_message.Message):
    __slots__ = ("roll_size", "roll_age_ms", "retain_size", "retain_age_ms", "reset")
    ROLL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROLL_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETAIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    roll_size: int
    roll_age_ms: int
    retain_size: int
    retain_age_ms: int
    reset: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, roll_size: _Optional[int] = ..., roll_age_ms: _Optional[int] = ..., retain_size: _Optional[int] = ..., retain_age_ms: _Optional[int] = ..., reset: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("action", "name", "policy", "codec", "names_only")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    NAMES_ONLY_FIELD_NUMBER: _ClassVar[int]
    action: StreamAction
    name: str
    policy: StreamPolicy
    codec: EventCodec
    names_only: bool
    def __init__(self, action: _Optional[_Union[StreamAction, str]] = ..., name: _Optional[str] = ..., policy: _Optional[_Union[StreamPolicy, _Mapping]] = ..., codec: _Optional[_Union[EventCodec, str]] = ..., names_only: _Optional[bool] = ...) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("name", "created_at_ms", "roll_size", "roll_age_ms", "retain_size", "retain_age_ms", "own", "segments", "next_number", "codec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ROLL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROLL_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETAIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    created_at_ms: int
    roll_size: int
    roll_age_ms: int
    retain_size: int
    retain_age_ms: int
    own: StreamPolicy
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    next_number: int
    codec: EventCodec
    def __init__(self, name: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., roll_size: _Optional[int] = ..., roll_age_ms: _Optional[int] = ..., retain_size: _Optional[int] = ..., retain_age_ms: _Optional[int] = ..., own: _Optional[_Union[StreamPolicy, _Mapping]] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., next_number: _Optional[int] = ..., codec: _Optional[_Union[EventCodec, str]] = ...) -> None: ...

class StreamList(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamInfo]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamInfo, _Mapping]]] = ...) -> None: ...

class TransactionRequest(_message.Message):
    __slots__ = ("action", "parent", "name", "timeout_ms")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    action: TransactionAction
    parent: str
    name: str
    timeout_ms: int
    def __init__(self, action: _Optional[_Union[TransactionAction, str]] = ..., parent: _Optional[str] = ..., name: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TransactionInfo(_message.Message):
    __slots__ = ("name", "parent", "segment", "offset", "length", "deadline_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    segment: str
    offset: int
    length: int
    deadline_ms: int
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., segment: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "token", "client")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    token: str
    client: str
    def __init__(self, protocol_version: _Optional[int] = ..., token: _Optional[str] = ..., client: _Optional[str] = ...) -> None: ...

class CreateSegmentRequest(_message.Message):
    __slots__ = ("segment", "attributes", "codec")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    segment: str
    attributes: _containers.RepeatedCompositeFieldContainer[AttributeUpdate]
    codec: EventCodec
    def __init__(self, segment: _Optional[str] = ..., attributes: _Optional[_Iterable[_Union[AttributeUpdate, _Mapping]]] = ..., codec: _Optional[_Union[EventCodec, str]] = ...) -> None: ...

class AttributeUpdate(_message.Message):
    __slots__ = ("id", "verb", "value", "compare_value", "expect_absent")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERB_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COMPARE_VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECT_ABSENT_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    verb: AttributeVerb
    value: int
    compare_value: int
    expect_absent: bool
    def __init__(self, id: _Optional[bytes] = ..., verb: _Optional[_Union[AttributeVerb, str]] = ..., value: _Optional[int] = ..., compare_value: _Optional[int] = ..., expect_absent: _Optional[bool] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("segment", "expected_offset", "attribute_updates", "writer_id", "event_number", "previous_event_number", "event_count", "data")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_UPDATES_FIELD_NUMBER: _ClassVar[int]
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_EVENT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    segment: str
    expected_offset: int
    attribute_updates: _containers.RepeatedCompositeFieldContainer[AttributeUpdate]
    writer_id: bytes
    event_number: int
    previous_event_number: int
    event_count: int
    data: bytes
    def __init__(self, segment: _Optional[str] = ..., expected_offset: _Optional[int] = ..., attribute_updates: _Optional[_Iterable[_Union[AttributeUpdate, _Mapping]]] = ..., writer_id: _Optional[bytes] = ..., event_number: _Optional[int] = ..., previous_event_number: _Optional[int] = ..., event_count: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class SealRequest(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: str
    def __init__(self, segment: _Optional[str] = ...) -> None: ...

class TruncateRequest(_message.Message):
    __slots__ = ("segment", "offset")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    segment: str
    offset: int
    def __init__(self, segment: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: str
    def __init__(self, segment: _Optional[str] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("segment", "timeout_ms")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    segment: str
    timeout_ms: int
    def __init__(self, segment: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class FsckRequest(_message.Message):
    __slots__ = ("deep", "repair")
    DEEP_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    deep: bool
    repair: bool
    def __init__(self, deep: _Optional[bool] = ..., repair: _Optional[bool] = ...) -> None: ...

class ExportMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateAttributesRequest(_message.Message):
    __slots__ = ("segment", "updates")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    segment: str
    updates: _containers.RepeatedCompositeFieldContainer[AttributeUpdate]
    def __init__(self, segment: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[AttributeUpdate, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: str
    def __init__(self, segment: _Optional[str] = ...) -> None: ...

class GetRecordRequest(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: str
    def __init__(self, segment: _Optional[str] = ...) -> None: ...

class ClusterRequest(_message.Message):
    __slots__ = ("take_over", "forget")
    TAKE_OVER_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    take_over: str
    forget: str
    def __init__(self, take_over: _Optional[str] = ..., forget: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeSummary(_message.Message):
    __slots__ = ("node", "version", "epoch", "uptime_s", "segments", "sealed_segments", "cold_segments", "journal_bytes", "journal_files", "journal_disk_bytes", "journal_disk_free_bytes", "journal_failed", "journal_short_of_space", "journal_refusals", "cache_pinned_bytes", "cache_journal_bytes", "cache_block_bytes", "cache_budget_bytes", "cache_hits", "cache_misses", "tier2", "tier2_unflushed_bytes", "tier2_unflushed_segments", "tier2_oldest_unflushed_s", "tier2_errors", "tier2_flush_failures", "tier2_failing_segments", "mountpoint", "mounted", "fuse_read_errors", "fuse_open_files", "embedded_s3", "embedded_s3_exits", "embedded_s3_restarts", "cluster", "lease_held", "fenced")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SEALED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    COLD_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FILES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FAILED_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_SHORT_OF_SPACE_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    CACHE_PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    TIER2_FIELD_NUMBER: _ClassVar[int]
    TIER2_UNFLUSHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER2_UNFLUSHED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TIER2_OLDEST_UNFLUSHED_S_FIELD_NUMBER: _ClassVar[int]
    TIER2_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TIER2_FLUSH_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TIER2_FAILING_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    MOUNTED_FIELD_NUMBER: _ClassVar[int]
    FUSE_READ_ERRORS_FIELD_NUMBER: _ClassVar[int]
    FUSE_OPEN_FILES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_S3_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_S3_EXITS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_S3_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LEASE_HELD_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    node: str
    version: str
    epoch: int
    uptime_s: float
    segments: int
    sealed_segments: int
    cold_segments: int
    journal_bytes: int
    journal_files: int
    journal_disk_bytes: int
    journal_disk_free_bytes: int
    journal_failed: str
    journal_short_of_space: bool
    journal_refusals: int
    cache_pinned_bytes: int
    cache_journal_bytes: int
    cache_block_bytes: int
    cache_budget_bytes: int
    cache_hits: int
    cache_misses: int
    tier2: str
    tier2_unflushed_bytes: int
    tier2_unflushed_segments: int
    tier2_oldest_unflushed_s: float
    tier2_errors: int
    tier2_flush_failures: int
    tier2_failing_segments: int
    mountpoint: str
    mounted: bool
    fuse_read_errors: int
    fuse_open_files: int
    embedded_s3: str
    embedded_s3_exits: int
    embedded_s3_restarts: int
    cluster: bool
    lease_held: bool
    fenced: bool
    def __init__(self, node: _Optional[str] = ..., version: _Optional[str] = ..., epoch: _Optional[int] = ..., uptime_s: _Optional[float] = ..., segments: _Optional[int] = ..., sealed_segments: _Optional[int] = ..., cold_segments: _Optional[int] = ..., journal_bytes: _Optional[int] = ..., journal_files: _Optional[int] = ..., journal_disk_bytes: _Optional[int] = ..., journal_disk_free_bytes: _Optional[int] = ..., journal_failed: _Optional[str] = ..., journal_short_of_space: _Optional[bool] = ..., journal_refusals: _Optional[int] = ..., cache_pinned_bytes: _Optional[int] = ..., cache_journal_bytes: _Optional[int] = ..., cache_block_bytes: _Optional[int] = ..., cache_budget_bytes: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., tier2: _Optional[str] = ..., tier2_unflushed_bytes: _Optional[int] = ..., tier2_unflushed_segments: _Optional[int] = ..., tier2_oldest_unflushed_s: _Optional[float] = ..., tier2_errors: _Optional[int] = ..., tier2_flush_failures: _Optional[int] = ..., tier2_failing_segments: _Optional[int] = ..., mountpoint: _Optional[str] = ..., mounted: _Optional[bool] = ..., fuse_read_errors: _Optional[int] = ..., fuse_open_files: _Optional[int] = ..., embedded_s3: _Optional[str] = ..., embedded_s3_exits: _Optional[int] = ..., embedded_s3_restarts: _Optional[int] = ..., cluster: _Optional[bool] = ..., lease_held: _Optional[bool] = ..., fenced: _Optional[bool] = ...) -> None: ...

class ChangesRequest(_message.Message):
    __slots__ = ("cursor", "limit", "streams_digest", "walk", "walk_after")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    WALK_FIELD_NUMBER: _ClassVar[int]
    WALK_AFTER_FIELD_NUMBER: _ClassVar[int]
    cursor: ChangeCursor
    limit: int
    streams_digest: int
    walk: bool
    walk_after: str
    def __init__(self, cursor: _Optional[_Union[ChangeCursor, _Mapping]] = ..., limit: _Optional[int] = ..., streams_digest: _Optional[int] = ..., walk: _Optional[bool] = ..., walk_after: _Optional[str] = ...) -> None: ...

class ChangeCursor(_message.Message):
    __slots__ = ("incarnation", "sequence")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    sequence: int
    def __init__(self, incarnation: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class DeletedSegment(_message.Message):
    __slots__ = ("id", "name")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ChangesResponse(_message.Message):
    __slots__ = ("cursor", "resync", "records", "deleted", "more", "streams_digest", "streams_changed", "streams", "walk_last")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    STREAMS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    STREAMS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    WALK_LAST_FIELD_NUMBER: _ClassVar[int]
    cursor: ChangeCursor
    resync: bool
    records: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.SegmentRecord]
    deleted: _containers.RepeatedCompositeFieldContainer[DeletedSegment]
    more: bool
    streams_digest: int
    streams_changed: bool
    streams: _containers.RepeatedScalarFieldContainer[str]
    walk_last: str
    def __init__(self, cursor: _Optional[_Union[ChangeCursor, _Mapping]] = ..., resync: _Optional[bool] = ..., records: _Optional[_Iterable[_Union[_metadata_pb2.SegmentRecord, _Mapping]]] = ..., deleted: _Optional[_Iterable[_Union[DeletedSegment, _Mapping]]] = ..., more: _Optional[bool] = ..., streams_digest: _Optional[int] = ..., streams_changed: _Optional[bool] = ..., streams: _Optional[_Iterable[str]] = ..., walk_last: _Optional[str] = ...) -> None: ...

class ListSegmentsRequest(_message.Message):
    __slots__ = ("prefix", "limit", "start_after", "local_only")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    limit: int
    start_after: str
    local_only: bool
    def __init__(self, prefix: _Optional[str] = ..., limit: _Optional[int] = ..., start_after: _Optional[str] = ..., local_only: _Optional[bool] = ...) -> None: ...

class GetAttributesRequest(_message.Message):
    __slots__ = ("segment", "ids", "start", "limit", "from_owner")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FROM_OWNER_FIELD_NUMBER: _ClassVar[int]
    segment: str
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    start: bytes
    limit: int
    from_owner: bool
    def __init__(self, segment: _Optional[str] = ..., ids: _Optional[_Iterable[bytes]] = ..., start: _Optional[bytes] = ..., limit: _Optional[int] = ..., from_owner: _Optional[bool] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("segment", "offset", "max_length", "wait_ms")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    segment: str
    offset: int
    max_length: int
    wait_ms: int
    def __init__(self, segment: _Optional[str] = ..., offset: _Optional[int] = ..., max_length: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("request_id", "error", "hello", "append", "info", "list", "attributes", "done", "read", "fsck", "metadata", "record", "cluster", "stream", "streams", "transaction", "replica_write", "replica_holdings", "replica_frames", "changes", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    FSCK_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_WRITE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FRAMES_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: Error
    hello: HelloResponse
    append: AppendResponse
    info: SegmentInfo
    list: SegmentList
    attributes: Attributes
    done: Done
    read: ReadResponse
    fsck: FsckResponse
    metadata: ExportMetadataResponse
    record: _metadata_pb2.SegmentRecord
    cluster: ClusterStatus
    stream: StreamInfo
    streams: StreamList
    transaction: TransactionInfo
    replica_write: ReplicaWriteResponse
    replica_holdings: ReplicaHoldings
    replica_frames: ReplicaFrames
    changes: ChangesResponse
    status: NodeSummary
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., hello: _Optional[_Union[HelloResponse, _Mapping]] = ..., append: _Optional[_Union[AppendResponse, _Mapping]] = ..., info: _Optional[_Union[SegmentInfo, _Mapping]] = ..., list: _Optional[_Union[SegmentList, _Mapping]] = ..., attributes: _Optional[_Union[Attributes, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ..., read: _Optional[_Union[ReadResponse, _Mapping]] = ..., fsck: _Optional[_Union[FsckResponse, _Mapping]] = ..., metadata: _Optional[_Union[ExportMetadataResponse, _Mapping]] = ..., record: _Optional[_Union[_metadata_pb2.SegmentRecord, _Mapping]] = ..., cluster: _Optional[_Union[ClusterStatus, _Mapping]] = ..., stream: _Optional[_Union[StreamInfo, _Mapping]] = ..., streams: _Optional[_Union[StreamList, _Mapping]] = ..., transaction: _Optional[_Union[TransactionInfo, _Mapping]] = ..., replica_write: _Optional[_Union[ReplicaWriteResponse, _Mapping]] = ..., replica_holdings: _Optional[_Union[ReplicaHoldings, _Mapping]] = ..., replica_frames: _Optional[_Union[ReplicaFrames, _Mapping]] = ..., changes: _Optional[_Union[ChangesResponse, _Mapping]] = ..., status: _Optional[_Union[NodeSummary, _Mapping]] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("id", "advertise", "state", "epoch", "version", "segments", "unflushed_bytes", "heartbeat_age_ms", "started_at_ms", "self", "ensemble", "quorum", "replicas_of", "hosted_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    UNFLUSHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_OF_FIELD_NUMBER: _ClassVar[int]
    HOSTED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    advertise: str
    state: str
    epoch: int
    version: str
    segments: int
    unflushed_bytes: int
    heartbeat_age_ms: int
    started_at_ms: int
    self: bool
    ensemble: _containers.RepeatedScalarFieldContainer[str]
    quorum: bool
    replicas_of: _containers.RepeatedScalarFieldContainer[str]
    hosted_by: str
    def __init__(self_, id: _Optional[str] = ..., advertise: _Optional[str] = ..., state: _Optional[str] = ..., epoch: _Optional[int] = ..., version: _Optional[str] = ..., segments: _Optional[int] = ..., unflushed_bytes: _Optional[int] = ..., heartbeat_age_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., self: _Optional[bool] = ..., ensemble: _Optional[_Iterable[str]] = ..., quorum: _Optional[bool] = ..., replicas_of: _Optional[_Iterable[str]] = ..., hosted_by: _Optional[str] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ...) -> None: ...

class FsckResponse(_message.Message):
    __slots__ = ("finding", "check", "progress", "last")
    FINDING_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    finding: FsckFinding
    check: FsckCheck
    progress: FsckProgress
    last: bool
    def __init__(self, finding: _Optional[_Union[FsckFinding, _Mapping]] = ..., check: _Optional[_Union[FsckCheck, _Mapping]] = ..., progress: _Optional[_Union[FsckProgress, _Mapping]] = ..., last: _Optional[bool] = ...) -> None: ...

class FsckFinding(_message.Message):
    __slots__ = ("check", "problem", "repaired", "message", "action", "segment", "key", "file", "offset")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    check: str
    problem: bool
    repaired: bool
    message: str
    action: str
    segment: str
    key: str
    file: str
    offset: int
    def __init__(self, check: _Optional[str] = ..., problem: _Optional[bool] = ..., repaired: _Optional[bool] = ..., message: _Optional[str] = ..., action: _Optional[str] = ..., segment: _Optional[str] = ..., key: _Optional[str] = ..., file: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class FsckCheck(_message.Message):
    __slots__ = ("name", "skipped", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    skipped: str
    detail: str
    def __init__(self, name: _Optional[str] = ..., skipped: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class FsckProgress(_message.Message):
    __slots__ = ("check", "done_bytes", "total_bytes", "done_items", "total_items")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DONE_ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ITEMS_FIELD_NUMBER: _ClassVar[int]
    check: str
    done_bytes: int
    total_bytes: int
    done_items: int
    total_items: int
    def __init__(self, check: _Optional[str] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., done_items: _Optional[int] = ..., total_items: _Optional[int] = ...) -> None: ...

class ExportMetadataResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: bytes
    def __init__(self, snapshot: _Optional[bytes] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("offset", "length", "start_offset", "sealed", "last", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    start_offset: int
    sealed: bool
    last: bool
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., start_offset: _Optional[int] = ..., sealed: _Optional[bool] = ..., last: _Optional[bool] = ..., data: _Optional[bytes] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "expected_offset", "last_event_number", "owner", "owner_address")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    expected_offset: int
    last_event_number: int
    owner: str
    owner_address: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., expected_offset: _Optional[int] = ..., last_event_number: _Optional[int] = ..., owner: _Optional[str] = ..., owner_address: _Optional[str] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("protocol_version", "server", "max_message_bytes", "max_append_bytes", "features")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_APPEND_BYTES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    server: str
    max_message_bytes: int
    max_append_bytes: int
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[int] = ..., server: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., max_append_bytes: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("offset", "length", "segment")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    segment: str
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., segment: _Optional[str] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("name", "id", "start_offset", "length", "storage_length", "sealed", "sealed_in_storage", "created_at_ms", "last_modified_ms", "event_count", "attribute_count", "chunk_count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    STORAGE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SEALED_IN_STORAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_MS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    start_offset: int
    length: int
    storage_length: int
    sealed: bool
    sealed_in_storage: bool
    created_at_ms: int
    last_modified_ms: int
    event_count: int
    attribute_count: int
    chunk_count: int
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., start_offset: _Optional[int] = ..., length: _Optional[int] = ..., storage_length: _Optional[int] = ..., sealed: _Optional[bool] = ..., sealed_in_storage: _Optional[bool] = ..., created_at_ms: _Optional[int] = ..., last_modified_ms: _Optional[int] = ..., event_count: _Optional[int] = ..., attribute_count: _Optional[int] = ..., chunk_count: _Optional[int] = ...) -> None: ...

class SegmentList(_message.Message):
    __slots__ = ("segments", "truncated")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    truncated: bool
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Attributes(_message.Message):
    __slots__ = ("values", "next")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AttributeValue]
    next: bytes
    def __init__(self, values: _Optional[_Iterable[_Union[_metadata_pb2.AttributeValue, _Mapping]]] = ..., next: _Optional[bytes] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
