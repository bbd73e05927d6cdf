"""The segment container: segment metadata and the operation processor.

This package's face hands on only the light names a client needs (results,
attribute verbs); the container itself is `gateway.container.container`, so
that importing a result type does not load the journal, the cache and RocksDB.
"""

from gateway.container.attributes import EVENT_COUNT, AttributeUpdate, Verb
from gateway.container.results import AppendResult, ReadResult, SegmentInfo

__all__ = [
    "EVENT_COUNT",
    "AppendResult",
    "AttributeUpdate",
    "ReadResult",
    "SegmentInfo",
    "Verb",
]
