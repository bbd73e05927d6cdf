"""Metadata snapshots in and out of a node: export, import, disaster recovery.

- **Export** writes the committed `MetadataSnapshot` (every segment, its
  chunk list and attributes) of a running daemon (the wire request
  ``ExportMetadata``) or of a stopped node's journal (replayed read-only) to
  a file (atomically), to stdout, or to an S3 object.
- **Import** reads one back (protobuf or its JSON view), checks it against
  Tier 2 (`gateway.recovery.rebuild.rebuild` without chunk replay: chunks
  that are gone, lengths past the last chunk) and installs it on an empty
  node.
- **Recovery** (``serve --recover-from-tier2``, ``import-metadata
  --from-tier2``) installs what `gateway.recovery.rebuild.rebuild_metadata`
  rebuilds from the newest snapshot and the chunks written after it.

Installing writes a new journal whose first operations are the epoch --
above every epoch Tier 2 has seen, so chunk names never collide and the
epoch fence holds -- and a checkpoint holding the metadata. It is written in
a staging directory and moved into the empty journal directory by rename,
so a crash leaves either no journal or a complete one: never a journal
without the checkpoint, which the next start would take for an empty node
(whose GC would then delete every chunk).
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from urllib.parse import urlsplit

import crc32c
import trio
from google.protobuf import json_format

from gateway.cluster.fence import current_epoch
from gateway.config import Config
from gateway.container.maintenance import MAX_PIECE_BYTES
from gateway.container.replayer import replay_metadata
from gateway.container.table import split_checkpoint
from gateway.errors import GatewayError, NodeNotEmpty, NothingToRecover, SnapshotInvalid
from gateway.journal import open_journal
from gateway.journal.files import DirectoryLock, fsync_directory, list_files
from gateway.protocol.metadata_pb2 import ContainerSnapshot, MetadataSnapshot
from gateway.recovery.rebuild import (
    RebuildReport,
    rebuild,
    rebuild_metadata,
)
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshots import build_snapshot, check_snapshot, object_metadata

log = logging.getLogger(__name__)

#: Where `install` writes the new journal before moving it into place. Its
#: name is not a journal file name, so the journal ignores a leftover one.
STAGING = "initial.tmp"


def encode(snapshot: MetadataSnapshot, as_json: bool = False) -> bytes:
    """The protobuf bytes, or with ``as_json`` the JSON view (proto3 JSON mapping)."""
    if not as_json:
        return snapshot.SerializeToString()
    text = json_format.MessageToJson(snapshot, preserving_proto_field_name=True, indent=1)
    return text.encode() + b"\n"


def decode(data: bytes, what: str) -> MetadataSnapshot:
    """A snapshot from protobuf bytes or its JSON view; SnapshotInvalid if unusable."""
    try:
        if data.lstrip()[:1] == b"{":
            snapshot = json_format.Parse(data.decode(), MetadataSnapshot())
        else:
            snapshot = MetadataSnapshot.FromString(data)
    except Exception as e:  # DecodeError, ParseError, UnicodeError: all mean unusable
        raise SnapshotInvalid(what, f"does not decode: {e}") from e
    return check_snapshot(snapshot, what)


# -- where snapshots go: a file, stdout, or an S3 object -----------------------------


def _s3_location(location: str, config: Config) -> tuple[ChunkLayer, str]:
    """A layer on the bucket of ``s3://BUCKET/KEY`` (configured endpoint), and KEY."""
    from gateway.storage.s3 import S3Storage

    parts = urlsplit(location)
    key = parts.path.lstrip("/")
    if not parts.netloc or not key or parts.query or parts.fragment:
        raise GatewayError(f"expected s3://BUCKET/KEY, got {location!r}")
    t = config.tier2
    storage = S3Storage(
        parts.netloc, endpoint_url=t.endpoint_url, region=t.region, timeout=t.request_timeout
    )
    return ChunkLayer(storage, retry_deadline=t.retry_deadline), key


def _write_file_atomically(path: pathlib.Path, data: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the directory."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(directory)


async def write_location(location: str, data: bytes, config: Config) -> None:
    """Write ``data`` to a file (atomically), ``-`` (stdout) or ``s3://BUCKET/KEY``."""
    if location == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    elif location.startswith("s3://"):
        layer, key = _s3_location(location, config)
        metadata = object_metadata(crc32c.crc32c(data))
        try:
            await layer.write(key, data, metadata)
        finally:
            await trio.to_thread.run_sync(layer.storage.close)
    else:
        try:
            await trio.to_thread.run_sync(_write_file_atomically, pathlib.Path(location), data)
        except OSError as e:
            raise GatewayError(f"cannot write {location}: {e.strerror or e}") from e


async def read_location(location: str, config: Config) -> bytes:
    """The bytes of a file, ``-`` (stdin) or ``s3://BUCKET/KEY`` (CRC32C checked if stored)."""
    if location == "-":
        return sys.stdin.buffer.read()
    if location.startswith("s3://"):
        layer, key = _s3_location(location, config)
        try:
            info = await layer.stat(key)
            data = await layer.read(key, 0, info.size)
        finally:
            await trio.to_thread.run_sync(layer.storage.close)
        want = info.metadata.get("crc32c")
        if want is not None and int(want, 16) != crc32c.crc32c(data):
            raise SnapshotInvalid(location, "its CRC32C does not match")
        return data
    try:
        return await trio.to_thread.run_sync(pathlib.Path(location).read_bytes)
    except OSError as e:
        raise GatewayError(f"cannot read {location}: {e.strerror or e}") from e


# -- export from a stopped node ------------------------------------------------------


def export_offline(config: Config) -> MetadataSnapshot:
    """The committed metadata in this node's journal, replayed read-only (blocking).

    Safe while a daemon runs (nothing is locked or changed), but then the
    result may lag it: ask the daemon instead.
    """
    directory = config.journal_dir
    if not directory.is_dir() or not list_files(directory):
        raise GatewayError(f"{directory} holds no journal to export (is node.data_dir right?)")
    container, epoch = replay_metadata(directory)
    return build_snapshot(container, config.node.id, epoch)


# -- installing metadata on an empty node -------------------------------------------


def ensure_empty(journal_dir: pathlib.Path) -> None:
    """NodeNotEmpty unless ``journal_dir`` is missing or holds no journal file."""
    if journal_dir.is_dir():
        files = list_files(journal_dir)
        if files:
            raise NodeNotEmpty(str(journal_dir), len(files))


def _move_into_place(staging: pathlib.Path, journal_dir: pathlib.Path) -> None:
    """Move the staged journal files into ``journal_dir``, durably (blocking).

    Newest first: should a (very large) checkpoint have rolled into a second
    file, that file alone is already a journal that starts with it.
    """
    for f in reversed(list_files(staging)):
        os.rename(f.path, journal_dir / f.path.name)
    fsync_directory(journal_dir)
    shutil.rmtree(staging)


async def install(config: Config, container: ContainerSnapshot, min_epoch: int) -> int:
    """Give an empty node ``container`` as its first checkpoint; return the epoch written.

    The next ``serve`` starts from it at a higher epoch still. Refuses
    (NodeNotEmpty) if the journal directory holds journal files; holds the
    directory's lock meanwhile, so no daemon can start halfway.
    """
    journal_dir = config.journal_dir
    journal_dir.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(journal_dir)
    try:
        ensure_empty(journal_dir)
        staging = journal_dir / STAGING
        if staging.exists():  # left by an interrupted import: never moved, so never used
            await trio.to_thread.run_sync(shutil.rmtree, staging)
        # In pieces if large (a whole checkpoint of 10^6 segments is ~150 MB).
        limit = min(MAX_PIECE_BYTES, config.journal.max_operation_bytes // 2)
        async with open_journal(staging, config.journal, min_epoch=min_epoch) as journal:
            for piece in split_checkpoint(container, limit):
                await journal.checkpoint(piece.SerializeToString())
            epoch = journal.epoch
        await trio.to_thread.run_sync(_move_into_place, staging, journal_dir)
    finally:
        lock.release()
    log.info(
        "installed the metadata of %d segment(s) as the first checkpoint of %s (epoch %d)",
        len(container.segments),
        journal_dir,
        epoch,
    )
    return epoch


def _log_report(report: RebuildReport) -> None:
    lines = report.summary()
    log.info("%s", lines[0])
    for line in lines[1:]:
        log.warning("%s", line)


async def import_metadata(
    config: Config, snapshot: MetadataSnapshot, what: str, log_report: bool = True
) -> RebuildReport:
    """Install an exported ``snapshot`` on this empty node, checked against Tier 2.

    Segments keep what Tier 2 holds: bytes past a segment's last chunk
    (only in the exporter's journal) are dropped and reported, as are
    chunks that are gone. ``log_report=False``: the caller shows the report.
    """
    node = config.node.id
    if snapshot.node != node:
        raise SnapshotInvalid(
            what,
            f"it is the metadata of node {snapshot.node!r}, this is {node!r}: set node.id "
            f"= {snapshot.node!r} (its chunks are under that name in Tier 2)",
        )
    ensure_empty(config.journal_dir)
    from gateway.tier2.bindings import open_tier2

    async with open_tier2(config) as tier2:
        rebuilt = await rebuild(tier2, node, snapshot, replay_chunks=False)
        fenced = await current_epoch(tier2, node)
    named = sum(len(r.chunks) for r in snapshot.container.segments)
    if named and len(rebuilt.report.missing_chunks) == named:
        # Not one chunk where the export says: this Tier 2 is not the
        # exporter's. Installing would make every segment empty or absent.
        raise NothingToRecover(
            f"Tier 2 holds none of the {named} chunk(s) {what} names: check tier2.url "
            "(it must be the exporter's)"
        )
    rebuilt.report.snapshot_key = what
    rebuilt.report.snapshot_epoch = snapshot.epoch
    rebuilt.report.snapshot_created_ms = snapshot.created_at_ms
    if log_report:
        _log_report(rebuilt.report)
    # Above every epoch this node id ever ran with: the old process is fenced.
    await install(config, rebuilt.container, max(rebuilt.max_epoch, fenced) + 1)
    return rebuilt.report


async def rebuild_node(
    config: Config,
    tier2: ChunkLayer,
    log_report: bool = True,
    status: Callable[[str], object] = lambda text: None,
) -> RebuildReport:
    """Disaster recovery of this empty node from Tier 2 alone; see `rebuild_metadata`.

    A takeover: first an epoch above every epoch this node id ever had is
    registered (a process still running with the id, a zombie, is fenced
    from then on), then the old process's lease is waited out, so that it
    acknowledges nothing more; only then is Tier 2 read, leaving out what a
    fenced process stored after its fence (`gateway.cluster.lease`).
    ``log_report=False``: the caller shows the report.
    """
    from gateway.cluster.fence import FenceTimes
    from gateway.cluster.lease import claim_epoch

    ensure_empty(config.journal_dir)
    node = config.node.id
    log.info("recovering the metadata of node %r from Tier 2", node)
    if not (
        await tier2.any_under(names.meta_prefix(node))
        or await tier2.any_under(names.chunks_prefix(node))
    ):
        # Before fencing anything: a wrong bucket or node id takes nothing over.
        raise NothingToRecover(
            f"Tier 2 holds no usable metadata snapshot and no chunk under {node!r}/: check "
            "tier2.url and node.id; a new, empty node starts without --recover-from-tier2"
        )
    fence = await current_epoch(tier2, node) + 1
    cl = config.cluster
    await claim_epoch(
        tier2,
        node,
        fence,
        str(config.journal_dir),
        lease=cl.lease,
        down_after=cl.down_after,
        heartbeat_interval=cl.heartbeat_interval,
        takeover=True,
        status=status,
    )
    fences = await FenceTimes.read(tier2, node)
    rebuilt = await rebuild_metadata(tier2, node, trusted=fences.trusted)
    if log_report:
        _log_report(rebuilt.report)
    # The journal starts at the registered epoch (or above every epoch Tier 2
    # holds, if higher); the next start registers the one after it.
    await install(config, rebuilt.container, max(rebuilt.max_epoch + 1, fence))
    return rebuilt.report


async def recover_from_tier2(config: Config, log_report: bool = True) -> RebuildReport:
    """`rebuild_node` with Tier 2 opened here (``import-metadata --from-tier2``)."""
    from gateway.tier2.bindings import open_tier2

    ensure_empty(config.journal_dir)
    async with open_tier2(config) as tier2:
        return await rebuild_node(config, tier2, log_report)
