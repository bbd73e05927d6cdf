"""A running node's storage parts, assembled in one place.

`open_node` builds, in order: the RocksDB cache store, Tier 2's chunk reader
(when there is a Tier 2), the read index over both, the segment table, the
journal (replayed into the table), the segment container, and the storage
writer; it runs their background tasks and, on exit, stops them in the
reverse order. Nothing below this module wires one part into another: the
container knows its journal and listeners only as protocols
(`gateway.container.interfaces`) and the read index knows Tier 2 only as a
source of flushed bytes (`gateway.read.index.FlushedBytes`).

The serving surfaces (protocol server, mount, metrics) and the lifecycle
(signals, systemd, the ordered stop) are `gateway.daemon`'s; fsck and the
benchmarks open a node the same way the daemon does.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import trio

from cache import CacheStore
from gateway.aio import service_nursery
from gateway.config import Config
from gateway.container.container import SegmentContainer
from gateway.container.interfaces import LeaseGate
from gateway.container.replayer import Replayer
from gateway.container.table import SegmentTable
from gateway.journal import Journal, open_journal
from gateway.read.chunks import ChunkReader
from gateway.read.index import ReadIndex
from gateway.stats import resident_bytes
from gateway.storage.layer import ChunkLayer
from gateway.tier2.storage_writer import StorageWriter

log = logging.getLogger(__name__)


def cache_budget(config: Config) -> int:
    """``cache.budget``, or for "auto": 4 GiB or 25% of the free disk, the smaller."""
    if config.cache.budget:
        return config.cache.budget
    directory = config.cache_dir
    directory.mkdir(parents=True, exist_ok=True)
    st = os.statvfs(directory)
    return max(64 * 1024 * 1024, min(4 * 1024**3, st.f_bavail * st.f_frsize // 4))


@dataclass(frozen=True)
class Node:
    """The parts of a running node that other parts and the serving surfaces use."""

    config: Config
    store: CacheStore
    read_index: ReadIndex
    journal: Journal
    container: SegmentContainer
    #: Tier 2's chunk reader and storage writer; None without a Tier 2 (unit
    #: tests of the layers above, benchmarks of the cache alone).
    reader: ChunkReader | None
    storage_writer: StorageWriter | None


#: Called with the new epoch once the journal is open, before anything runs:
#: registers it (the cluster's fence) and returns the lease changes need.
Claim = Callable[[int], Awaitable[LeaseGate | None]]


@asynccontextmanager
async def open_node(
    config: Config,
    tier2: ChunkLayer | None = None,
    claim: Claim | None = None,
    container_type: type[SegmentContainer] = SegmentContainer,
    replicated: bool = False,
) -> AsyncIterator[Node]:
    """Replay the journal and serve the node's storage until exit.

    With ``tier2``, flushed bytes are read back from it and the storage
    writer moves committed bytes there in the background; without it,
    everything stays in the journal and the cache. ``claim`` runs after the
    replay and before any background work (the storage writer, rolls): a
    node that may not run under its epoch raises there, having uploaded or
    changed nothing. On a clean exit a final checkpoint is written, so the
    next start replays little. ``container_type``: a subclass of
    `SegmentContainer` to build (tests call theirs directly). ``replicated``:
    the caller attaches a replicator to the journal; until it does, nothing
    journaled is durable (`Journal.require_replication`).
    """
    store = await trio.to_thread.run_sync(
        CacheStore.open, config.cache_dir, cache_budget(config), config.cache.pinned_share
    )
    try:
        async with _open_parts(config, store, tier2, claim, container_type, replicated) as node:
            yield node
    finally:
        await trio.to_thread.run_sync(store.close)


def give_back_memory() -> None:
    """Collect garbage and hand freed heap back to the system (glibc's
    ``malloc_trim``; a no-op elsewhere), so that RSS shows what is kept."""
    gc.collect()
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@asynccontextmanager
async def _open_parts(
    config: Config,
    store: CacheStore,
    tier2: ChunkLayer | None,
    claim: Claim | None,
    container_type: type[SegmentContainer],
    replicated: bool = False,
) -> AsyncIterator[Node]:
    reader = None
    if tier2 is not None:
        reader = ChunkReader(
            tier2,
            store,
            read_ahead=config.tier2.read_ahead,
            memory_bytes=config.fuse.prefetch_memory,
        )
    read_index = ReadIndex(store, reader)
    table = SegmentTable(read_index)
    replayer = Replayer(table)
    started = time.monotonic()
    try:
        async with open_journal(
            config.journal_dir,
            config.journal,
            replayer.replay,
            replayer.on_file,
            on_data=replayer.on_data,
        ) as journal:
            if replicated:
                journal.require_replication()
            replayer.finish()
            # The replay parsed whole checkpoints and kept a little of each.
            await trio.to_thread.run_sync(give_back_memory)
            container = container_type(config.container, table, journal, config.streams)
            container.node_id = config.node.id
            log.info(
                "container: recovered %d segment(s) in %.2fs (resident memory %d MiB)",
                container.segment_count,
                time.monotonic() - started,
                resident_bytes() >> 20,
            )
            lease = await claim(journal.epoch) if claim is not None else None
            container.lease = lease
            async with service_nursery() as nursery:
                nursery.start_soon(container.run_maintenance)
                nursery.start_soon(container.run_cooling)
                nursery.start_soon(container.run_streams)
                nursery.start_soon(read_index.run_store_queue)
                writer = None
                if tier2 is not None and reader is not None:
                    await nursery.start(reader.run)
                    writer = StorageWriter(
                        container, tier2, config.tier2, config.node.id, journal.epoch, reader
                    )
                    writer.lease = lease
                    container.storage = writer
                    container.attribute_store = writer.attributes
                    await nursery.start(writer.run)
                node = Node(config, store, read_index, journal, container, reader, writer)
                try:
                    yield node
                    await container.wait_settled()
                    if (
                        journal.failed is None
                        and not journal.replication_ended
                        and journal.statistics().frames_since_checkpoint
                    ):
                        # (Not once the replication stopped: it could not be
                        # made durable; the next start replays a little more.)
                        await container.checkpoint()
                finally:
                    container.close()
                    # Shielded so a cancelled shutdown still empties the queue, but
                    # bounded: the data is in the journal either way.
                    with trio.CancelScope(shield=True), trio.move_on_after(30):
                        await read_index.wait_written()
                    nursery.cancel_scope.cancel()
    finally:
        # After every task that could read is done.
        read_index.close()
