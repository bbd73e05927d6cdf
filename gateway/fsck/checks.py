"""fsck's checks: one function per named check, run in a fixed order (here).

1. ``journal`` (`check_journal`): every frame and its CRC32C, sequence
   numbers and epochs, as recovery reads them; a torn tail, files without
   frames, and corruption (a bad frame with valid frames after it).
2. ``metadata`` (`check_metadata`): the committed metadata's invariants per
   segment: ``start_offset <= storage_length <= length``, chunks sorted,
   contiguous and non-overlapping, covering ``[start_offset,
   storage_length)``, ``sealed_in_storage`` only when sealed and all in Tier
   2, the event index in range, and the bytes above Tier 2 in the journal.
3. ``chunks`` (`check_chunks`): every chunk object exists (HEAD) with at
   least its recorded length.
4. ``chunk-data`` (`check_chunk_data`, ``--deep`` only): every chunk read in
   full and its CRC32C compared with the record (and cached blocks with
   the bytes read).
5. ``orphans`` (`check_orphans`): chunk objects no segment names, found
   with GC's own pass (`gateway.tier2.gc.collect`).
6. ``cache`` (`check_cache`): Tier-2 blocks in the cache whose chunk no
   segment names or whose size disagrees with the chunk record.
7. ``name-claims`` (`check_name_claims`): this node's name claims in Tier
   2 whose name is no segment or stream of it (a node that stopped between
   a deletion and its release).

Each lives in a module named for what it checks (`journal_check`,
`metadata_check`, `chunk_checks` for 3, 4 and the attribute indexes,
`orphan_check`, `cache_check`, `claim_check`); `target` holds what they share. This module
runs them in order and re-exports them.

The journal is checked from its files; the others from a `Target`: the
committed metadata, the Tier-2 binding and the cache of one node, either
rebuilt from a stopped node's directories (`gateway.fsck.run`) or the
running daemon's own (`gateway.fsck.online`). A check that finds something
it can safely fix fixes it only when asked (``--repair``) and says so.

When a stopped node's journal is corrupt, checks 3-5 run against the newest
metadata snapshot in Tier 2 instead (`run_snapshot_checks`): what it names
is checked, what came after it is not known, so nothing in Tier 2 is
changed on its word.
"""

from __future__ import annotations

from gateway.container.segment import record_chunks

from .cache_check import check_cache
from .chunk_checks import check_attribute_indexes, check_chunk_data, check_chunks
from .claim_check import check_name_claims
from .journal_check import JournalScan, check_journal, scan_journal
from .metadata_check import check_metadata, segment_problems
from .orphan_check import check_orphans
from .report import Sink
from .target import CheckRun, CheckState, Options, Target, skip

__all__ = [
    "CheckRun",
    "CheckState",
    "JournalScan",
    "Options",
    "Target",
    "check_attribute_indexes",
    "check_cache",
    "check_chunk_data",
    "check_chunks",
    "check_journal",
    "check_metadata",
    "check_name_claims",
    "check_orphans",
    "record_chunks",
    "run_snapshot_checks",
    "run_target_checks",
    "scan_journal",
    "segment_problems",
    "skip",
]


async def run_snapshot_checks(target: Target, options: Options, sink: Sink) -> None:
    """Checks 3-5 and 7 on a target whose metadata is a Tier-2 snapshot (``target.basis``).

    The metadata check is the caller's (it says why the journal's metadata
    is missing); the cache is skipped, since which chunks the metadata names
    now is not known. Nothing in Tier 2 is changed, whatever ``--repair``.
    """
    state = CheckState()
    for r in sorted(target.snapshot().segments, key=lambda r: r.name):
        state.chunks.extend((r.name, c) for c in record_chunks(r))
    await check_chunks(target, state, CheckRun("chunks", sink, options))
    await check_chunk_data(target, state, CheckRun("chunk-data", sink, options))
    await check_attribute_indexes(target, state, CheckRun("attribute-index", sink, options))
    await check_orphans(target, CheckRun("orphans", sink, options))
    await skip(
        "cache",
        sink,
        "the journal is corrupt: which chunks its metadata names now is not known",
    )
    await check_name_claims(target, CheckRun("name-claims", sink, options))


async def run_target_checks(target: Target, options: Options, sink: Sink) -> None:
    """Checks 2-7 on ``target``, in order."""

    def run(name: str) -> CheckRun:
        return CheckRun(name, sink, options)

    state = await check_metadata(target, run("metadata"))
    await check_chunks(target, state, run("chunks"))
    await check_chunk_data(target, state, run("chunk-data"))
    await check_attribute_indexes(target, state, run("attribute-index"))
    await check_orphans(target, run("orphans"))
    await check_cache(target, state, run("cache"))
    await check_name_claims(target, run("name-claims"))
