"""The segment container: segment metadata and the operation processor."""

from gateway.container.attributes import EVENT_COUNT, AttributeUpdate, Verb
from gateway.container.container import (
    AppendResult,
    ContainerCorrupt,
    PendingOperation,
    SegmentContainer,
    open_container,
)
from gateway.container.segment import SegmentInfo

__all__ = [
    "EVENT_COUNT",
    "AppendResult",
    "AttributeUpdate",
    "ContainerCorrupt",
    "PendingOperation",
    "SegmentContainer",
    "SegmentInfo",
    "Verb",
    "open_container",
]
