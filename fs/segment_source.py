"""Where the mount's segments come from: one small protocol, and this node's source.

Segment files (`cache.segment_files`, for passthrough) are also bytes of
segments from below the mount: they are reached from here too.

The filesystem core (`fs.vfs`) asks a `SegmentSource` which segments exist,
for their metadata (`gateway.container.segment.Segment`, the committed view)
and for their bytes, and registers for changes to the namespace. It asks
nothing else, so a second kind of source -- segments of other nodes, read
from Tier 2 -- can stand beside `LocalSegments`, which serves this node's
container.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cache.segment_files import SegmentFileKey, SegmentFiles
from gateway.buffers import Buffer
from gateway.cluster.remote import REMOTE_ID_BASE
from gateway.cluster.view import ClusterView
from gateway.container.container import SegmentContainer
from gateway.container.interfaces import NamespaceWatcher
from gateway.container.segment import Segment
from gateway.errors import SegmentNotFound
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import ChunkReader
from gateway.read.index import SegmentView

__all__ = ["SegmentFileKey", "SegmentFiles", "SegmentSource", "file_key"]


def file_key(seg: Segment) -> SegmentFileKey | None:
    """The segment file (`cache.segment_files`) that may serve ``seg`` by passthrough:
    sealed segments of this node only.

    Other nodes' segments have ids on this node that a restart renumbers
    (`gateway.cluster.remote`), so a file named by one could come back as
    another segment's bytes; they would need files named by owner and id.
    """
    if not seg.sealed or seg.id >= REMOTE_ID_BASE:
        return None
    return SegmentFileKey(seg.id, seg.created_at_ms, seg.start_offset, seg.length)


class SegmentSource(Protocol):
    """Segments, their committed metadata and bytes, and news of changes."""

    def segments(self) -> Sequence[Segment]:
        """Every live segment (committed)."""

    def segment_by_id(self, segment_id: int) -> Segment | None:
        """The live segment with this id, if any."""

    def totals(self) -> tuple[int, int]:
        """(4 KiB blocks, count) of the live segments, without a pass over them all
        where they are this node's (statfs is asked every few seconds by
        monitoring agents, and a pass would warm every cold segment)."""

    def streams(self) -> Sequence[str]:
        """The names of every live stream (directories shown with or without segments)."""

    async def read(self, seg: SegmentView, offset: int, size: int) -> Buffer:
        """Committed bytes from ``offset`` (< ``seg.length``): zeros below the start offset.

        Raises GatewayError when they cannot be read (a Tier-2 failure).
        """

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        """Fetch ``[start, stop)`` of these chunks ahead of a reader; the blocks scheduled."""

    def watch(self, watcher: NamespaceWatcher) -> None:
        """Tell ``watcher`` about creates, seals, truncations and deletes from now on
        (of streams too)."""

    def unwatch(self, watcher: NamespaceWatcher) -> None:
        """Stop telling ``watcher``."""

    def owner(self, segment_id: int) -> tuple[str, bool]:
        """(owning node id, whether bytes past the flushed length are readable)."""


class LocalSegments:
    """This node's segments: its container, and Tier 2's chunk reader for read-ahead."""

    def __init__(
        self, container: SegmentContainer, reader: ChunkReader | None, node_id: str = ""
    ) -> None:
        self.container = container
        self.reader = reader
        self.node_id = node_id

    def segments(self) -> Sequence[Segment]:
        """Every live segment of the container but transactions (not in the mount)."""
        return [s for s in self.container.segments() if not s.hidden]

    def segment_by_id(self, segment_id: int) -> Segment | None:
        """The container's live segment with this id."""
        return self.container.segment_by_id(segment_id)

    def totals(self) -> tuple[int, int]:
        """(4 KiB blocks, count) of the container's live segments, as it keeps
        them (transactions included)."""
        return self.container.total_blocks, self.container.segment_count

    def streams(self) -> Sequence[str]:
        """The container's streams."""
        return self.container.stream_names()

    async def read(self, seg: SegmentView, offset: int, size: int) -> Buffer:
        """Through the read index; read-ahead is the caller's (per open file)."""
        return await self.container.read_index.read_buffer(seg, offset, size, read_ahead=False)

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        """Through the chunk reader (nothing without Tier 2)."""
        return 0 if self.reader is None else self.reader.prefetch(chunks, start, stop)

    def watch(self, watcher: NamespaceWatcher) -> None:
        """Register with the container."""
        self.container.watchers.append(watcher)

    def unwatch(self, watcher: NamespaceWatcher) -> None:
        """Unregister from the container."""
        self.container.watchers.remove(watcher)

    def owner(self, segment_id: int) -> tuple[str, bool]:
        """This node's segments are its own, tails included."""
        return self.node_id, True


class ClusterSegments:
    """Every segment of the cluster: this node's, then every other node's.

    Other nodes' segments (`gateway.cluster.remote`) have ids of their own
    on this node, from `REMOTE_ID_BASE` up, so one id names one segment.
    """

    def __init__(self, local: LocalSegments, cluster: ClusterView) -> None:
        self.local = local
        self.cluster = cluster

    def segments(self) -> Sequence[Segment]:
        """This node's live segments, then the other nodes'."""
        return [*self.local.segments(), *self.cluster.segments()]

    def totals(self) -> tuple[int, int]:
        """This node's totals, and the other nodes' segments counted."""
        size, count = self.local.totals()
        for node in self.cluster.nodes.values():
            size += node.total_blocks
            count += len(node.segments)
        return size, count

    def segment_by_id(self, segment_id: int) -> Segment | None:
        """A local or remote segment by its id on this node."""
        if segment_id < REMOTE_ID_BASE:
            return self.local.segment_by_id(segment_id)
        return self.cluster.segment_by_id(segment_id)

    def streams(self) -> Sequence[str]:
        """This node's streams, then the other nodes'."""
        return [*self.local.streams(), *self.cluster.streams()]

    async def read(self, seg: SegmentView, offset: int, size: int) -> Buffer:
        """Local segments through the read index; remote ones from chunks and their owner."""
        if seg.id < REMOTE_ID_BASE:
            return await self.local.read(seg, offset, size)
        node = self.cluster.node_of(seg.id)
        if node is None:
            raise SegmentNotFound(seg.name)
        return await node.read(seg, offset, size)

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        """Through the one chunk reader: chunk names say whose they are."""
        return self.local.prefetch(chunks, start, stop)

    def watch(self, watcher: NamespaceWatcher) -> None:
        """Register with the container and the cluster view."""
        self.local.watch(watcher)
        self.cluster.watch(watcher)

    def unwatch(self, watcher: NamespaceWatcher) -> None:
        """Unregister from both."""
        self.local.unwatch(watcher)
        self.cluster.unwatch(watcher)

    def owner(self, segment_id: int) -> tuple[str, bool]:
        """(owning node id, whether bytes past the flushed length are readable)."""
        node = self.cluster.node_of(segment_id)
        if node is None:
            return self.cluster.node_id, True
        return node.node_id, node.tail_available
