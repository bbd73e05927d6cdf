"""User-facing errors.

Every error an operator or client may see is a subclass of `GatewayError`.
Following borg, each class's docstring is its message template (formatted with
the constructor's arguments) and each class carries the process exit code the
CLI uses for it. The codes are listed in docs/OPERATIONS.md.
"""

from __future__ import annotations

from typing import ClassVar


class GatewayError(Exception):
    """Error: {}"""

    #: Exit code of the CLI when this error ends it.
    exit_code: ClassVar[int] = 1
    #: The wire protocol's ErrorCode name for this error.
    wire_code: ClassVar[str] = "INTERNAL"
    _text: str | None = None

    @classmethod
    def from_text(cls, text: str) -> GatewayError:
        """An instance carrying an already formatted message (from the wire)."""
        e = cls.__new__(cls)
        Exception.__init__(e, text)
        e._text = text
        return e

    def message(self) -> str:
        """The formatted, one-line message for humans."""
        if self._text is not None:
            return self._text
        template = type(self).__doc__ or "{}"
        try:
            return template.format(*self.args)
        except (IndexError, KeyError):
            return f"{type(self).__name__}: {self.args!r}"

    def __str__(self) -> str:
        return self.message()


class ConfigError(GatewayError):
    """configuration {} has {} error(s):
    {}"""

    exit_code = 2

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(source, len(errors), "\n".join(f"  {e}" for e in errors))
        #: One line per problem, each naming the key: "section.key: reason".
        self.errors = list(errors)


class JournalError(GatewayError):
    """journal error: {}"""


class JournalCorrupt(JournalError):
    """journal is corrupt: {} at offset {}: {}. The journal was not changed; \
run `segment-gateway fsck` (or `segment-gateway journal-dump` to inspect)"""

    exit_code = 3

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, reason)
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalLocked(JournalError):
    """journal directory {} is in use by another process ({}); \
only one daemon may open a journal"""

    exit_code = 4


class JournalFailed(JournalError):
    """journal failed and accepts no more appends: {}. Acknowledged operations are safe; \
restart the daemon to recover"""

    exit_code = 5


class JournalRefused(JournalError):
    """journal cannot take operations now: {}. Nothing was written; retry later"""

    exit_code = 6


class JournalFull(JournalRefused):
    """journal disk is full: cannot allocate {} bytes in {} ({}). Nothing was written; \
free space and retry"""


class JournalFenced(JournalError):
    """not acknowledged: {} -- this process accepts no more changes; stop it"""

    exit_code = 46


class JournalClosed(JournalError):
    """journal is closed"""


class TooLarge(GatewayError):
    """{} of {} bytes exceeds the limit of {} bytes"""

    exit_code = 17
    wire_code = "TOO_LARGE"


class OperationTooLarge(TooLarge):
    """operation of {} bytes exceeds the limit of {} bytes"""

    exit_code = 2


# -- segment errors (Pravega's list; DESIGN.md "Segments") ----------------------


class SegmentError(GatewayError):
    """segment {!r}: {}"""


class SegmentNotFound(SegmentError):
    """segment {!r} does not exist"""

    exit_code = 10
    wire_code = "SEGMENT_NOT_FOUND"


class StreamNotFound(SegmentNotFound):
    """stream {!r} does not exist"""


class SegmentExists(SegmentError):
    """segment {!r} already exists"""

    exit_code = 11
    wire_code = "SEGMENT_EXISTS"


class SegmentSealed(SegmentError):
    """segment {!r} is sealed"""

    exit_code = 12
    wire_code = "SEGMENT_SEALED"


class BadOffset(SegmentError):
    """segment {!r}: {} (its length is {})"""

    exit_code = 13
    wire_code = "BAD_OFFSET"

    def __init__(self, segment: str, problem: str, expected_offset: int) -> None:
        super().__init__(segment, problem, expected_offset)
        #: The segment's length (for a conditional append: where to append).
        self.expected_offset = expected_offset


class ConditionalCheckFailed(SegmentError):
    """segment {!r}: condition failed: {}"""

    exit_code = 14
    wire_code = "CONDITIONAL_CHECK_FAILED"
    #: For a failed writer condition: the writer's stored event number.
    last_event_number: int = 0


class SegmentTruncated(SegmentError):
    """segment {!r}: offset {} was truncated (the segment starts at {})"""

    exit_code = 26
    wire_code = "SEGMENT_TRUNCATED"

    def __init__(self, segment: str, offset: int, start_offset: int) -> None:
        super().__init__(segment, offset, start_offset)
        #: The segment's start offset: the first offset that can be read.
        self.expected_offset = start_offset


class BadAttributeUpdate(SegmentError):
    """segment {!r}: bad attribute update: {}"""

    exit_code = 15
    wire_code = "BAD_ATTRIBUTE_UPDATE"


class InvalidName(GatewayError):
    """invalid segment name {!r}: {}"""

    exit_code = 16
    wire_code = "INVALID_NAME"


class Overloaded(GatewayError):
    """overloaded: {}; retry later"""

    exit_code = 18
    wire_code = "OVERLOADED"


class Unauthorized(GatewayError):
    """unauthorized: {}"""

    exit_code = 19
    wire_code = "UNAUTHORIZED"


class LimitExceeded(GatewayError):
    """limit exceeded: {}"""

    exit_code = 20
    wire_code = "LIMIT_EXCEEDED"


class Unavailable(GatewayError):
    """unavailable: {}"""

    exit_code = 21
    wire_code = "UNAVAILABLE"


class IndexMoved(Unavailable):
    """unavailable: attribute index of segment id {} moved on while read ({} gone); retry"""

    # A reader that took an index record before an await may find chunks
    # the storage writer deleted since (a newer batch moved the head past
    # them). The container looks again with the record as it is now.


class BadRequest(GatewayError):
    """bad request: {}"""

    exit_code = 22
    wire_code = "BAD_REQUEST"


class NotATransaction(BadRequest):
    """{!r} is not a transaction (transactions are the .txn/... names `txn begin` prints)"""

    exit_code = 40
    wire_code = "NOT_A_TRANSACTION"


class TransactionEnded(GatewayError):
    """transaction {!r} has ended: {}"""

    # What became of it is in the daemon's record of finished transactions
    # (streams.txn_outcomes), which answers a commit or abort sent again.


class TransactionTimedOut(TransactionEnded):
    """transaction {!r} timed out: it was not committed before its deadline and is aborted"""

    exit_code = 41
    wire_code = "TRANSACTION_TIMED_OUT"


class TransactionAborted(TransactionEnded):
    """transaction {!r} was aborted"""

    exit_code = 42
    wire_code = "TRANSACTION_ABORTED"


class TransactionCommitted(TransactionEnded):
    """transaction {!r} was committed into {!r} at offset {}"""

    exit_code = 43
    wire_code = "TRANSACTION_COMMITTED"


class ProtocolError(GatewayError):
    """protocol error: {}"""

    exit_code = 23
    wire_code = "MALFORMED"


class Unsupported(ProtocolError):
    """unsupported: {}"""

    wire_code = "UNSUPPORTED"


class NotOwner(SegmentError):
    """segment {!r} belongs to node {} at {}"""

    exit_code = 32
    wire_code = "NOT_OWNER"

    def __init__(self, name: str, owner: str, owner_address: str) -> None:
        super().__init__(name, owner, owner_address)
        #: The owning node and where it listens: the client follows it there.
        self.owner = owner
        self.owner_address = owner_address


class OwnerDown(Unavailable):
    """segment {!r} belongs to node {}, which is {}: changes to it wait until that node \
is back or its node id is taken over (retry later; reads of what it flushed work on \
any node)"""

    exit_code = 45
    wire_code = "OWNER_DOWN"

    def __init__(self, name: str, owner: str, state: str, owner_address: str = "") -> None:
        super().__init__(name, owner, state)
        self.owner = owner
        self.owner_address = owner_address


class ReplicaFenced(Unavailable):
    """replica {} refuses epoch {} of node {}: a recovery fenced epochs below {} (this \
process was taken over; stop it)"""

    exit_code = 46
    wire_code = "REPLICA_FENCED"


class ReplicaGap(BadRequest):
    """replica log of node {} epoch {} expects sequence {}, not {}"""

    wire_code = "REPLICA_GAP"

    def __init__(self, source: str, epoch: int, expected: int, got: int) -> None:
        super().__init__(source, epoch, expected, got)
        #: The next sequence the log expects (0: it holds no log of that epoch).
        self.expected_offset = expected


class NoQuorum(Unavailable):
    """not acknowledged: {} (replication.ack_quorum); the operation may still become \
durable once enough replicas answer -- retry, an exactly-once writer resends only what \
is missing"""

    exit_code = 47
    wire_code = "NO_QUORUM"


class SegmentExistsElsewhere(SegmentExists):
    """segment {!r} already exists on node {}"""

    def __init__(self, name: str, owner: str, owner_address: str = "") -> None:
        super().__init__(name, owner)
        self.owner = owner
        self.owner_address = owner_address


class ConnectionLost(GatewayError):
    """connection to {} lost: {}"""

    exit_code = 24


class Tier2Error(GatewayError):
    """Tier 2 failed: {}"""

    exit_code = 27
    wire_code = "TIER2_UNAVAILABLE"


class FlushTimeout(Tier2Error):
    """{} (a flush's time ran out; the data is safe in the journal and is flushed later)"""


class ChunkNotFound(Tier2Error):
    """Tier-2 object {!r} does not exist"""


class ChunkCorrupt(Tier2Error):
    """Tier-2 object {!r} is corrupt: {}. Run `segment-gateway fsck`"""

    exit_code = 3


class BindingUnsupported(Tier2Error):
    """the {} binding does not support {}"""


class MountError(GatewayError):
    """cannot mount the segments at {}: {}"""

    exit_code = 28


class NodeNotEmpty(GatewayError):
    """{} holds a journal ({} file(s)): import-metadata and --recover-from-tier2 \
only set up an empty node, they never replace a journal. Start without them, \
or move the journal away first if this node is really to be rebuilt"""

    exit_code = 29


class NothingToRecover(GatewayError):
    """nothing to recover: {}"""

    exit_code = 30


class SnapshotInvalid(GatewayError):
    """{}: not a usable metadata snapshot: {}"""

    exit_code = 2


#: Wire ErrorCode name -> the error class a client raises for it.
BY_WIRE_CODE: dict[str, type[GatewayError]] = {
    cls.wire_code: cls
    for cls in (
        GatewayError, TooLarge, SegmentNotFound, SegmentExists, SegmentSealed, BadOffset,
        ConditionalCheckFailed, BadAttributeUpdate, InvalidName, Overloaded, Unauthorized,
        SegmentTruncated, NotOwner, OwnerDown, ReplicaFenced, ReplicaGap, NoQuorum,
        LimitExceeded, Unavailable, BadRequest, ProtocolError, Unsupported, Tier2Error,
        NotATransaction, TransactionTimedOut, TransactionAborted, TransactionCommitted,
    )
}  # fmt: skip


def os_reason(e: BaseException) -> str:
    """The short reason of an OSError or SSLError: OpenSSL's (``KEY_VALUES_MISMATCH``),
    the errno text, or else the message."""
    return str(getattr(e, "reason", None) or getattr(e, "strerror", None) or e)
