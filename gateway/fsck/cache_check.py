"""fsck check 6, ``cache``: Tier-2 blocks in the cache whose chunk no segment names
or whose size disagrees with the chunk record."""

from __future__ import annotations

import trio

from gateway.read.chunks import BLOCK_SIZE
from gateway.storage import object_keys as names

from .target import CheckRun, CheckState, Target


async def check_cache(target: Target, state: CheckState, run: CheckRun) -> None:
    """Check 6: cached Tier-2 blocks that disagree with the chunk records.

    A block of a chunk no segment names, a block past its chunk's end, a
    block longer than the record allows, or (``--deep``) one whose bytes
    differ from Tier 2. With ``--repair`` all blocks of such a chunk are
    dropped: the cache is only a copy. A block *shorter* than expected is
    fine: its chunk grew by an append since, and readers fetch it again.
    Blocks of other nodes' chunks (a cluster's mount reads them through
    this cache) are not judged: their records are their owners'.
    """
    store = target.store
    if store is None:
        if target.cache_error:
            await run.problem(target.cache_error)
            await run.done()
        else:
            await run.done("no cache here")
        return
    blocks = await trio.to_thread.run_sync(store.blocks)
    # After the listing: a chunk named (or grown) since is seen as it is now.
    records = target.chunks_now()
    uploading = target.uploading()
    by_chunk: dict[str, list[tuple[int, int]]] = {}
    own = names.node_prefix(target.node)
    others = 0
    for chunk, index, size in blocks:
        if not chunk.startswith(own):
            others += 1
            continue
        by_chunk.setdefault(chunk, []).append((index, size))
    for chunk, found in sorted(by_chunk.items()):
        reasons = []
        rec = records.get(chunk)
        if rec is None:
            if chunk in uploading:
                continue
            reasons.append("no segment names the chunk")
        else:
            for index, size in found:
                if names.is_attribute_chunk(chunk):
                    # A page, cached by its offset in the chunk.
                    if index + size > rec.length:
                        reasons.append(
                            f"page at {index} ({size} bytes) lies past the chunk's end "
                            f"({rec.length} bytes)"
                        )
                    continue
                expected = min(BLOCK_SIZE, rec.length - index * BLOCK_SIZE)
                if expected <= 0:
                    reasons.append(f"block {index} lies past the chunk's end ({rec.length} bytes)")
                elif size > expected:
                    reasons.append(f"block {index} has {size} bytes, the record allows {expected}")
            for index in sorted(state.cache_mismatch.get(chunk, ())):
                reasons.append(f"block {index} differs from the chunk in Tier 2")
        if not reasons:
            continue
        action = ""
        if run.options.repair:
            await trio.to_thread.run_sync(store.drop_chunk, chunk)
            target.forget_chunk(chunk)
            action = f"dropped its {len(found)} cached block(s)"
        await run.problem(
            f"cache: {len(found)} block(s) of chunk {chunk}: {'; '.join(reasons)}",
            action=action,
            repaired=run.options.repair,
            key=chunk,
        )
    run.detail = f"{len(blocks) - others} block(s) of {len(by_chunk)} chunk(s)"
    if others:
        run.detail += f"; {others} block(s) of other nodes' chunks, not checked here"
    await run.done()
