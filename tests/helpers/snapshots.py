"""A node's metadata as Tier 2 holds it, read as every reader does (the newest
whole snapshot with its newest delta applied), for tests that look at it
directly in a bucket or directory."""

from __future__ import annotations

import trio

from gateway.protocol.metadata_pb2 import MetadataSnapshot
from gateway.recovery.rebuild import RebuildReport
from gateway.storage.interface import ChunkStorage
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshot_store import newest_snapshot


def newest_metadata(storage: ChunkStorage, node: str) -> tuple[str, MetadataSnapshot] | None:
    """(key of what was read last -- a delta's if one applied --, the snapshot), or None."""
    layer = ChunkLayer(storage, retry_deadline=5.0)
    return trio.run(newest_snapshot, layer, node, RebuildReport())
