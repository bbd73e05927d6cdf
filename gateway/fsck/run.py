"""``segment-gateway fsck``: offline on a stopped node, or through a running daemon.

The journal directory's lock decides (`gateway.journal.files.DirectoryLock`):

- **Offline** (the lock is free; fsck holds it throughout, so no daemon can
  start meanwhile): the journal is read with the recovery code, the
  committed metadata rebuilt from it the way the daemon's start does
  (`replay_for_fsck`), then Tier 2 is opened as configured (``embedded``
  starts SeaweedFS from the data directory) and the cache, and every check
  runs here. ``--repair`` fixes what is safe: a torn journal tail, files
  without frames, garbage objects older than ``tier2.gc_grace``, cache
  entries that disagree. A journal that gives no metadata (corrupt, or
  not replaying) leaves Tier 2 checked against its newest metadata
  snapshot, with no repairs there (`_from_snapshot`).
- **Online** (a daemon holds the lock, or ``--connect`` names one): the
  journal files are read here, read-only (as ``journal-dump`` does) --
  only if a directory was named (not with ``--connect`` alone) and a
  running daemon holds it (`online_journal_skip`) -- and the daemon runs
  the other checks on its live state and streams the findings
  (`gateway.fsck.online`); ``--repair`` then makes only the repairs the
  daemon makes by itself anyway.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import pathlib
from contextlib import AsyncExitStack
from typing import Any, TextIO

import trio

from cache import CacheStore
from gateway.config import Config
from gateway.errors import GatewayError, JournalCorrupt, JournalLocked
from gateway.journal.files import LOCK_NAME, DirectoryLock
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.storage import object_keys as names

from .checks import (
    CheckRun,
    Options,
    Target,
    check_journal,
    record_chunks,
    run_snapshot_checks,
    run_target_checks,
    skip,
)
from .output import Printer
from .report import CHECKS, Sink, from_wire


class FsckUsageError(GatewayError):
    """fsck: {}"""

    exit_code = 2


def _lock(journal_dir: pathlib.Path) -> DirectoryLock | None:
    """The journal's lock if no daemon holds it; None if one does."""
    if not journal_dir.is_dir():
        raise FsckUsageError(
            f"there is no journal directory {journal_dir} (is --config or --data-dir right?)"
        )
    try:
        return DirectoryLock(journal_dir)
    except JournalLocked:
        return None
    except PermissionError as e:
        raise FsckUsageError(
            f"cannot lock {journal_dir}: {e.strerror}; run fsck as the daemon's user"
        ) from None


async def _skip_rest(sink: Sink, after: str, reason: str) -> None:
    for name in CHECKS[CHECKS.index(after) + 1 :]:
        await skip(name, sink, reason)


async def _open_tier2(stack: AsyncExitStack, config: Config) -> tuple[Any, str]:
    """The configured Tier 2, checked to answer; (None, why) if it does not."""
    from gateway.tier2.bindings import open_tier2

    try:
        layer = await stack.enter_async_context(open_tier2(config))
        # One listing (as serve does before READY): a dead endpoint or a
        # missing bucket shows here once, not once per chunk.
        await layer.list(names.meta_prefix(config.node.id))
    except (GatewayError, OSError) as e:
        return None, f"Tier 2 ({config.tier2.url}) does not answer: {e}"
    return layer, ""


async def _open_cache(stack: AsyncExitStack, config: Config) -> tuple[CacheStore | None, str]:
    """The node's cache (opening drops stale pinned copies, as every start does)."""
    from gateway.node import cache_budget

    directory = config.cache_dir
    if not (directory / "CURRENT").exists():
        return None, ""
    try:
        store = await trio.to_thread.run_sync(
            CacheStore.open, directory, cache_budget(config), config.cache.pinned_share
        )
    except Exception as e:  # rocksdict raises bare exceptions
        return None, f"cannot open the cache {directory}: {e}"
    stack.push_async_callback(trio.to_thread.run_sync, store.close)
    return store, ""


async def _from_snapshot(config: Config, options: Options, sink: Sink, replay_error: str) -> None:
    """The journal gives no metadata: check Tier 2 against its newest metadata snapshot.

    ``replay_error``: the journal reads but does not replay (a problem of
    the metadata check); "" if it is corrupt (the journal check said so).
    """
    from gateway.cluster.fence import FenceTimes
    from gateway.recovery.rebuild import RebuildReport
    from gateway.tier2.snapshot_store import newest_snapshot

    why = (
        "the journal does not replay" if replay_error else "the journal cannot be read"
    ) + ", so the committed metadata cannot be rebuilt"
    run = CheckRun("metadata", sink, options)
    if replay_error:
        await run.problem(f"the journal does not replay: {replay_error}")
    async with AsyncExitStack() as stack:
        layer, tier2_error = await _open_tier2(stack, config)
        found = None
        if layer is not None:
            try:
                # Never a snapshot a fenced process stored after its fence.
                fences = await FenceTimes.read(layer, config.node.id)
                found = await newest_snapshot(
                    layer, config.node.id, RebuildReport(), fences.trusted
                )
            except GatewayError as e:
                tier2_error = f"cannot list the metadata snapshots in Tier 2: {e}"
            if found is None and not tier2_error:
                tier2_error = f"Tier 2 holds no readable metadata snapshot of {config.node.id!r}"
        if found is None:
            reason = f"{why}, and {tier2_error}: no metadata to check"
            if replay_error:
                await run.done()
            else:
                await run.done(reason)
            await _skip_rest(sink, "metadata", reason)
            return
        key, snap = found
        taken = datetime.datetime.fromtimestamp(snap.created_at_ms / 1000, datetime.UTC)
        basis = f"snapshot {key} ({taken:%Y-%m-%d %H:%M:%S} UTC, epoch {snap.epoch})"
        instead = (
            f"chunks, chunk-data and orphans use the newest metadata snapshot in Tier 2 "
            f"instead, {key} (taken {taken:%Y-%m-%d %H:%M:%S} UTC, epoch {snap.epoch}); "
            "changes after it are not seen, and nothing is repaired in Tier 2"
        )
        if replay_error:
            await run.note(instead)
            await run.done()
        else:
            await run.done(f"{why}; {instead}")
        records = {c.name: c for s in snap.container.segments for c in record_chunks(s)}
        target = Target(
            online=False,
            node=config.node.id,
            tier2=config.tier2,
            snapshot=lambda: snap.container,
            read_index=None,
            layer=layer,
            store=None,
            chunks_now=lambda: records,
            basis=basis,
            basis_time=snap.created_at_ms / 1000,
        )
        await run_snapshot_checks(target, options, sink)


async def run_offline(config: Config, options: Options, sink: Sink) -> None:
    """Every check on a stopped node (the caller holds the journal's lock).

    A journal that cannot give the metadata (corrupt, or not replaying)
    leaves Tier 2 to be checked against its newest metadata snapshot.
    """
    from gateway.container.replayer import replay_for_fsck
    from gateway.container.table import ContainerCorrupt

    journal_dir = config.journal_dir
    if not await check_journal(journal_dir, CheckRun("journal", sink, options)):
        await _from_snapshot(config, options, sink, "")
        return
    try:
        table = await trio.to_thread.run_sync(replay_for_fsck, journal_dir)
    except (ContainerCorrupt, JournalCorrupt) as e:
        await _from_snapshot(config, options, sink, str(e))
        return
    snapshot = table.committed_snapshot()
    records = {c.name: c for s in snapshot.segments for c in record_chunks(s)}
    async with AsyncExitStack() as stack:
        layer, tier2_error = await _open_tier2(stack, config)
        store, cache_error = await _open_cache(stack, config)

        def chunks_now() -> dict[str, ChunkRecord]:
            return records

        target = Target(
            online=False,
            node=config.node.id,
            tier2=config.tier2,
            snapshot=lambda: snapshot,
            read_index=table.read_index,
            layer=layer,
            store=store,
            chunks_now=chunks_now,
            tier2_error=tier2_error,
            cache_error=cache_error,
        )
        await run_target_checks(target, options, sink)


def _held_by_a_daemon(journal_dir: pathlib.Path) -> bool:
    """Whether a running daemon holds ``journal_dir``'s lock (a shared probe, let go at once)."""
    try:
        fd = os.open(journal_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's lock too
    return False


def online_journal_skip(journal_dir: pathlib.Path | None, address: str, connect: bool) -> str:
    """Why the journal at ``journal_dir`` is not checked online ("" = check it).

    The journal is read from its files by this command, so only a directory
    that is there, readable, and in use by a running daemon is the daemon's
    journal; fsck says which of these is not so rather than check another.
    """
    if journal_dir is None:
        return (
            "the journal is read from its files, and neither --data-dir nor a configuration "
            "file names them here; on the daemon's node add --data-dir (or --config) to "
            "check it too"
        )
    if not journal_dir.is_dir():
        return f"there is no journal directory {journal_dir} on this machine"
    if not os.access(journal_dir, os.R_OK | os.X_OK):
        return f"{journal_dir} is not readable here: run fsck as the daemon's user"
    if connect and not _held_by_a_daemon(journal_dir):
        return (
            f"no running daemon holds {journal_dir}, so it is not the journal of the daemon "
            f"at {address}; check a stopped node's journal with fsck without --connect"
        )
    return ""


async def run_online(
    address: str,
    token: str,
    tls: dict[str, Any],
    options: Options,
    sink: Sink,
    journal_dir: pathlib.Path | None,
    connect: bool = True,
) -> None:
    """The journal check here (if its files are here), the others by the daemon at ``address``.

    ``journal_dir`` None: no directory was named (``--connect`` without
    ``--data-dir`` or a configuration file). ``connect``: the address was
    given, rather than found through the lock of ``journal_dir``.
    """
    from gateway.client.client import open_client

    why = online_journal_skip(journal_dir, address, connect)
    if journal_dir is not None and not why:
        await check_journal(journal_dir, CheckRun("journal", sink, options), online=True)
    else:
        await skip("journal", sink, why)
    async with open_client(address, token, **tls) as client:
        async for message in client.fsck(deep=options.deep, repair=options.repair):
            event = from_wire(message)
            if event is not None:
                await sink(event)


def fsck(
    config: Config,
    options: Options,
    out: TextIO,
    err: TextIO,
    *,
    as_json: bool = False,
    connect: str = "",
    token: str = "",
    tls: dict[str, Any] | None = None,
    node_dirs_named: bool = True,
    quiet: bool = False,
) -> int:
    """Run fsck, print what it finds, return the exit code (0 clean, 1 repaired, 2 left).

    ``node_dirs_named``: ``config``'s directories were named by the
    operator (``--data-dir``, or a configuration file), not defaults; with
    ``connect`` and without them, no local journal is checked.
    ``quiet``: no progress bar (there is none when ``err`` is not a terminal).
    """
    printer = Printer(out, err, as_json, quiet)
    journal_dir = config.journal_dir
    lock = None if connect else _lock(journal_dir)
    if lock is None:
        address = connect or config.server.listen
        local = journal_dir if node_dirs_named or not connect else None
        trio.run(run_online, address, token, tls or {}, options, printer, local, bool(connect))
        return printer.finish(f"online, through {address}")
    try:
        trio.run(run_offline, config, options, printer)
    finally:
        lock.release()
    return printer.finish("offline")
