"""fsck checks of the chunk objects in Tier 2: 3 ``chunks`` (each exists, with at
least its recorded length), 4 ``chunk-data`` (``--deep``: each read in full,
its CRC32C compared with the record, and cached blocks with the bytes read),
and 4b ``attribute-index`` (every attribute index is a sound tree)."""

from __future__ import annotations

import time

from cache import CacheStore
from gateway.aio import crc32c_of
from gateway.errors import ChunkNotFound, GatewayError, Tier2Error
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import BLOCK_SIZE
from gateway.storage import object_keys as names

from .target import (
    HANDS_OFF,
    CheckRun,
    CheckState,
    Target,
    for_each,
    per_basis,
    show_size,
    without_tier2,
)

#: A deep read fetches a chunk in ranged GETs of this size (whole cache blocks).
READ_PIECE = 8 * BLOCK_SIZE


async def restore_from_cache(
    target: Target, run: CheckRun, segment: str, c: ChunkRecord
) -> tuple[bool, str]:
    """Rewrite a lost or damaged chunk object from its cached blocks: (done, action).

    Only offline (a running daemon may append to its own chunks), and only
    when the cache holds every block and their bytes match the record's
    CRC32C: then they are exactly the bytes that were flushed.
    """
    store, layer = target.store, target.layer
    if not run.options.repair:
        return False, ""
    if target.online:
        return False, "not repaired here: stop the daemon; fsck --repair may then restore it"
    if target.basis:
        return False, f"not repaired: {HANDS_OFF}"
    count = -(-c.length // BLOCK_SIZE)
    pieces = []
    for index in range(count):
        block = store.get_block(c.name, index) if store is not None else None
        expected = min(BLOCK_SIZE, c.length - index * BLOCK_SIZE)
        if block is None or len(block) < expected:
            have = sum(1 for i in range(count) if store is not None and store.block_size(c.name, i))
            return False, (
                "not repaired: no copy left to restore it from "
                f"(the cache holds {have} of its {count} block(s))"
            )
        pieces.append(block[:expected])
    data = b"".join(pieces)
    if await crc32c_of(data) != c.crc32c:
        return False, "not repaired: the cached copy does not match the record's CRC32C either"
    assert layer is not None
    try:
        await layer.write(
            c.name, data, names.chunk_metadata(segment, c.start_offset, c.length, c.crc32c, c.epoch)
        )
    except Tier2Error as e:
        return False, f"not repaired: writing the cached copy back failed: {e}"
    return True, "restored from the cache (CRC32C verified)"


async def check_chunks(target: Target, state: CheckState, run: CheckRun) -> None:
    """Check 3: every chunk object exists with at least its recorded length.

    The journal lets flushed bytes go, so a missing or short object can be
    repaired only from the cache: with ``--repair`` offline, when every
    block is cached and they match the record's CRC32C, they are written
    back (`restore_from_cache`). Otherwise the bytes are lost.
    """
    layer = target.layer
    if layer is None:
        await without_tier2(target, run, first=True)
        return
    found: dict[str, tuple[int, str]] = {}  # key -> (size, error)

    async def head(item: tuple[str, ChunkRecord]) -> None:
        key = item[1].name
        try:
            found[key] = ((await layer.stat(key)).size, "")
        except ChunkNotFound:
            found[key] = (-1, "")
        except Tier2Error as e:
            found[key] = (-1, str(e))

    await for_each(state.chunks, head, target.tier2.max_concurrency)
    # A running daemon may have dropped a chunk (truncation) since the
    # snapshot, and deleted its object: only chunks still named count.
    named = set(target.chunks_now()) if target.online else None
    for segment, c in state.chunks:
        size, error = found[c.name]
        end = c.start_offset + c.length
        where = f"segment {segment!r} [{c.start_offset}, {end})"
        if size >= c.length:
            if size > c.length:
                await run.note(
                    f"chunk object {c.name} holds {size - c.length} byte(s) past its recorded "
                    f"length {c.length} (an append {'in progress or ' if target.online else ''}"
                    "cut off by a crash; they are never read)",
                    segment=segment,
                    key=c.name,
                )
            continue
        if named is not None and c.name not in named:
            continue
        state.bad.add(c.name)
        repaired, action = False, ""
        if error:
            message = f"{where}: cannot stat chunk object {c.name}: {error}"
        else:
            if size < 0:
                message = f"{where}: chunk object {c.name} is missing; reads of these bytes fail"
            else:
                message = (
                    f"{where}: chunk object {c.name} has {size} bytes, its record says "
                    f"{c.length}; reads of [{c.start_offset + size}, {end}) fail"
                )
            if target.basis:
                message += (
                    " (named by the snapshot; a truncation or deletion since may have dropped it)"
                )
            repaired, action = await restore_from_cache(target, run, segment, c)
        await run.problem(
            message,
            action=action,
            repaired=repaired,
            segment=segment,
            key=c.name,
            offset=c.start_offset,
        )
    run.detail = f"{len(state.chunks)} chunk object(s)" + per_basis(target)
    await run.done()


def _cache_differs(store: CacheStore, key: str, start: int, data: bytes) -> list[int]:
    """Indexes of cached blocks of ``key`` within ``data`` (read at ``start``) that differ."""
    differ = []
    if names.is_attribute_chunk(key):
        # Attribute index pages are cached by their offset in the chunk.
        for chunk, offset, size in store.blocks():
            if chunk != key or not start <= offset < start + len(data):
                continue
            cached = store.get_block(key, offset)
            want = data[offset - start : offset - start + size]
            if cached is not None and cached != want:
                differ.append(offset)
        return differ
    for rel in range(0, len(data), BLOCK_SIZE):
        index = (start + rel) // BLOCK_SIZE
        if store.block_size(key, index) is None:
            continue
        cached = store.get_block(key, index)
        want = data[rel : rel + BLOCK_SIZE]
        # A cached block may be shorter (the chunk grew since); never different.
        if cached is not None and cached != want[: len(cached)]:
            differ.append(index)
    return differ


async def check_chunk_data(target: Target, state: CheckState, run: CheckRun) -> None:
    """Check 4 (``--deep``): read every chunk, compare its CRC32C with the record.

    Reads go through the chunk layer in parallel (``tier2.max_concurrency``),
    in 8 MiB ranged GETs; cached blocks are compared with the bytes read
    (the cache check reports the ones that differ). A damaged chunk is
    repaired as a missing one is: from the cache, if it holds a good copy.
    """
    layer = target.layer
    if not run.options.deep:
        await run.done("--deep reads every chunk")
        return
    if layer is None:
        await without_tier2(target, run, first=False)
        return
    todo = [(s, c) for s, c in state.chunks if c.name not in state.bad]
    total = sum(c.length for _, c in todo)
    done_bytes = done_chunks = 0
    #: (segment, chunk, why, whether a copy from the cache would fix it)
    damaged: list[tuple[str, ChunkRecord, str, bool]] = []
    store = target.store
    started = time.monotonic()
    await run.progress(0, total, 0, len(todo))

    async def read(item: tuple[str, ChunkRecord]) -> None:
        nonlocal done_bytes, done_chunks
        segment, c = item
        crc = 0
        mismatched: list[int] = []
        pos = 0
        try:
            while pos < c.length:
                want = min(READ_PIECE, c.length - pos)
                data = await layer.read(c.name, pos, want)
                if len(data) != want:
                    damaged.append((segment, c, f"read {len(data)} of {want} bytes at {pos}", True))
                    return
                crc = await crc32c_of(data, crc)
                if store is not None:
                    mismatched += _cache_differs(store, c.name, pos, data)
                pos += want
                done_bytes += want
                await run.progress(done_bytes, total, done_chunks, len(todo))
        except Tier2Error as e:
            damaged.append((segment, c, f"read failed: {e}", False))
            return
        finally:
            done_chunks += 1
            done_bytes += c.length - pos
        if crc != c.crc32c:
            damaged.append((segment, c, f"CRC32C {crc:08x}, its record says {c.crc32c:08x}", True))
        elif mismatched:
            # Only against bytes that proved right: when the chunk is
            # damaged, the cached copy may be the good one.
            state.cache_mismatch[c.name] = set(mismatched)

    await for_each(todo, read, target.tier2.max_concurrency)
    await run.progress(total, total, len(todo), len(todo))
    named = set(target.chunks_now()) if target.online else None
    order = {c.name: i for i, (_, c) in enumerate(state.chunks)}
    for segment, c, why, restorable in sorted(damaged, key=lambda d: order[d[1].name]):
        if named is not None and c.name not in named:
            continue  # dropped (truncated, deleted) while it was read
        state.bad.add(c.name)
        repaired, action = False, ""
        if restorable:
            repaired, action = await restore_from_cache(target, run, segment, c)
        await run.problem(
            f"segment {segment!r} [{c.start_offset}, {c.start_offset + c.length}): chunk object "
            f"{c.name} is damaged: {why}",
            action=action,
            repaired=repaired,
            segment=segment,
            key=c.name,
            offset=c.start_offset,
        )
    elapsed = time.monotonic() - started
    run.detail = f"{len(todo)} chunk(s), {show_size(total)} read in {elapsed:.1f}s"
    run.detail += per_basis(target)
    await run.done()


async def check_attribute_indexes(target: Target, state: CheckState, run: CheckRun) -> None:
    """Check 4b: every attribute index is a sound tree.

    Its pages parse (magic, version, CRC32C), keys are in order within and
    across pages, each index entry's lowest-page-offset bookkeeping holds,
    and no live page lies below the index's truncation offset (so deleting
    the chunks below it lost nothing). Pages are read through the cache and
    Tier 2; an index whose chunks the chunk check found bad is reported
    there only. Nothing is repaired: the journal's values are the truth
    until the next batch rewrites the pages.
    """
    from gateway.attrindex.btree import IndexCorrupt
    from gateway.attrindex.store import AttributeIndexStore

    layer = target.layer
    records = [
        r
        for r in sorted(target.snapshot().segments, key=lambda r: r.name)
        if r.attribute_index.root_length
    ]
    if layer is None:
        if not records:
            await run.done("no attribute indexes")
        else:
            await without_tier2(target, run, first=False)
        return
    # Pages come through the cache when it has them, but fsck never adds
    # any: beside a running daemon it could cache a chunk being deleted.
    indexes = AttributeIndexStore(
        layer, target.node, target.store, page_cache_bytes=0, cache_writes=False
    )
    for r in records:
        if any(c.name in state.bad for c in r.attribute_index.chunks):
            continue
        index = r.attribute_index
        for _ in range(3):
            try:
                problems = await indexes.verify(r.id, index)
            except (IndexCorrupt, GatewayError) as e:
                problems = [str(e)]
            if not problems or not target.online:
                break
            # A running daemon may have moved the index on since the
            # snapshot (and deleted chunks it named): check it as it is now.
            now = next((s for s in target.snapshot().segments if s.id == r.id), None)
            if now is None:
                problems = []  # deleted meanwhile
                break
            if (now.attribute_index.root_offset, now.attribute_index.length) == (
                index.root_offset,
                index.length,
            ):
                break
            index = now.attribute_index
        for message in problems:
            await run.problem(
                f"segment {r.name!r}: attribute index: {message}",
                action="not repaired" if run.options.repair else "",
                segment=r.name,
            )
    run.detail = f"{len(records)} attribute index(es)" + per_basis(target)
    await run.done()
