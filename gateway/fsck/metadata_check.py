"""fsck check 2, ``metadata``: the committed metadata's invariants per segment.

``start_offset <= storage_length <= length``, chunks sorted, contiguous and
non-overlapping, covering ``[start_offset, storage_length)``,
``sealed_in_storage`` only when sealed and all in Tier 2, the event index in
range, and the bytes above Tier 2 in the journal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from gateway.container.segment import record_chunks
from gateway.protocol.metadata_pb2 import SegmentRecord
from gateway.read.index import SegmentView

from .target import CheckRun, CheckState, Target, show_size


def segment_problems(r: SegmentRecord) -> Iterable[tuple[str, int | None]]:
    """What is wrong with one segment's metadata: (message, offset) pairs."""
    name = repr(r.name)
    if not r.start_offset <= r.storage_length <= r.length:
        yield (
            f"segment {name}: start offset {r.start_offset}, storage length "
            f"{r.storage_length} and length {r.length} are out of order "
            "(start offset <= storage length <= length)",
            None,
        )
    if r.sealed_in_storage and not (r.sealed and r.storage_length == r.length):
        why = (
            "it is not sealed"
            if not r.sealed
            else f"only {r.storage_length} of its {r.length} bytes are in Tier 2"
        )
        yield f"segment {name}: marked sealed in storage, but {why}", None
    chunks = list(r.chunks)
    if not chunks:
        if r.storage_length > r.start_offset:
            yield (
                f"segment {name}: no chunks, but bytes [{r.start_offset}, {r.storage_length}) "
                "are said to be in Tier 2",
                r.start_offset,
            )
    else:
        first, last = chunks[0], chunks[-1]
        if first.start_offset > r.start_offset:
            yield (
                f"segment {name}: no chunk holds [{r.start_offset}, {first.start_offset})",
                r.start_offset,
            )
        if first.start_offset + first.length <= r.start_offset:
            yield (
                f"segment {name}: chunk {first.name} [{first.start_offset}, "
                f"{first.start_offset + first.length}) lies wholly below the start offset "
                f"{r.start_offset}",
                first.start_offset,
            )
        for a, b in itertools.pairwise(chunks):
            end = a.start_offset + a.length
            if b.start_offset > end:
                yield (f"segment {name}: no chunk holds [{end}, {b.start_offset})", end)
            elif b.start_offset < end:
                yield (
                    f"segment {name}: chunks {a.name} and {b.name} overlap at "
                    f"[{b.start_offset}, {min(end, b.start_offset + b.length)})",
                    b.start_offset,
                )
        last_end = last.start_offset + last.length
        total = sum(c.length for c in chunks)
        if last_end != r.storage_length:
            yield (
                f"segment {name}: chunks end at {last_end}, the storage length is "
                f"{r.storage_length} (chunk lengths sum to {total} from "
                f"{first.start_offset})",
                min(last_end, r.storage_length),
            )
    index = list(r.event_index)
    if index and (index != sorted(set(index)) or index[0] < r.start_offset or index[-1] > r.length):
        yield (
            f"segment {name}: event index is not ascending within [{r.start_offset}, {r.length}]",
            None,
        )


def _merge_problems(r: SegmentRecord, by_id: dict[int, SegmentRecord]) -> Iterator[str]:
    """A merge not yet done in Tier 2 must fit its target (the "merged" shape of a commit)."""
    if not r.merged_into:
        return
    t = by_id.get(r.merged_into)
    if t is None:
        yield f"segment {r.name}: merged into segment id {r.merged_into}, which does not exist"
        return
    if not r.sealed:
        yield f"segment {r.name}: merged into {t.name} but not sealed"
    if r.merge_offset + r.length > t.length:
        yield (
            f"segment {r.name}: merged into {t.name} at {r.merge_offset}, past its length "
            f"{t.length}"
        )
    # (A target truncated past the merge offset no longer needs the bytes.)
    if t.start_offset <= r.merge_offset < t.storage_length:
        yield (
            f"segment {r.name}: merged into {t.name} at {r.merge_offset}, but the target is "
            f"in Tier 2 up to {t.storage_length} without its chunks"
        )


async def check_metadata(target: Target, run: CheckRun) -> CheckState:
    """Check 2: invariants of the committed metadata; nothing is repaired.

    The metadata is the journal's (its operations and checkpoints): fsck
    does not rewrite it, so every problem here is left for the operator.
    """
    # Snapshot and journal coverage are read together, without yielding, so
    # a running daemon cannot change one between them.
    snap = target.snapshot()
    gaps: dict[int, str] = {}
    by_id = {r.id: r for r in snap.segments}
    # Committed transactions whose merge is not done in Tier 2 yet: the
    # target's bytes at [merge_offset, + source length) are the source's.
    merged: dict[int, list[SegmentRecord]] = {}
    for r in snap.segments:
        if r.merged_into:
            merged.setdefault(r.merged_into, []).append(r)

    def view_of(r: SegmentRecord) -> SegmentView:
        sources = sorted(merged.get(r.id, []), key=lambda m: m.merge_offset)
        return SegmentView(
            r.id,
            r.name,
            r.start_offset,
            r.length,
            r.sealed,
            r.storage_length,
            list(r.chunks),
            tuple((m.merge_offset, view_of(m)) for m in sources),
        )

    if target.read_index is not None:
        for r in snap.segments:
            gap = target.read_index.coverage_gap(view_of(r))
            if gap is not None:
                gaps[r.id] = gap
    action = (
        "not repaired: fsck does not rewrite the journal's metadata" if run.options.repair else ""
    )
    state = CheckState()
    records = sorted(snap.segments, key=lambda r: r.name)
    for r in records:
        for message, offset in segment_problems(r):
            await run.problem(message, action=action, segment=r.name, offset=offset)
        for message in _merge_problems(r, by_id):
            await run.problem(message, action=action, segment=r.name)
        if r.id in gaps:
            await run.problem(
                f"segment {r.name!r}: bytes above Tier 2 are not all in the journal: {gaps[r.id]}",
                action=action,
                segment=r.name,
            )
        state.chunks.extend((r.name, c) for c in record_chunks(r))
    stored = sum(r.storage_length - r.start_offset for r in records)
    run.detail = (
        f"{len(records)} segment(s), {len(state.chunks)} chunk(s), "
        f"{show_size(sum(r.length for r in records))} committed, "
        f"{show_size(max(stored, 0))} in Tier 2"
    )
    await run.done()
    return state
