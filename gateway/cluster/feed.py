"""The change feed: what changed among a node's own segments since a cursor.

How one node follows another (`RemoteNode.refresh_live`): instead of
listing every segment of the owner each ``cluster.refresh_interval``, it
asks for the changes since its cursor and gets the committed records of
the segments changed since then and the ids and names of those deleted,
a page at a time. A request costs the owner what changed since the
cursor, not what it holds.

A cursor is (incarnation, journal sequence). The incarnation is a random
number drawn for each container object this process loads: the table's
change log lives in memory and begins again with every load, so a cursor
of another run -- a restart, a takeover on another host, a node rebuilt
from Tier 2 whose journal begins lower -- can never be read against a
journal it was not taken from; it is answered ``resync``, as are a
cursor older than the changes the table keeps (`SegmentTable.changes_floor`)
and one ahead of its journal. A follower told to resync lists the owner
in full, as before the feed, and follows from the cursor of that answer,
which it took before listing (so nothing changed between the two is
missed; what the listing shows already comes again, harmlessly).

A follower without a cursor walks the owner instead (`walk_page`): every
segment's committed record, a page at a time in name order, each page a
range of the owner's sorted names -- so a first sync of a million segments
is a few hundred requests, not a listing and a request per segment. It
then follows from the cursor of the walk's first page. An owner older than
walks answers a walk "resync" (it carries no cursor); such an owner is
listed.

Stream names are not in the change log; each answer carries a digest of
them, and the names themselves when the follower's digest differs.
"""

from __future__ import annotations

import hashlib
import heapq
import secrets
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.container.streams import is_hidden
from gateway.protocol import wire_pb2 as wire

if TYPE_CHECKING:
    from gateway.container.container import SegmentContainer
    from gateway.container.segment import Segment

#: The request kind, as HelloResponse.features names it.
FEATURE = "changes"
#: Changes per answer unless the request asks for fewer; at most MAX_LIMIT.
DEFAULT_LIMIT = 1_000
MAX_LIMIT = 10_000
#: An answer's records and names stop growing past this many bytes (or half
#: the server's max_message_bytes if less); one change always goes.
PAGE_BYTES = 1 << 20

#: One change: its sequence, and the segment changed or (id, name) of one deleted.
_Event = tuple[int, "Segment | None", tuple[int, str]]

_incarnations: weakref.WeakKeyDictionary[SegmentContainer, int] = weakref.WeakKeyDictionary()


def incarnation(container: SegmentContainer) -> int:
    """The container's incarnation: random, non-zero, the same while it is loaded."""
    found = _incarnations.get(container)
    if found is None:
        found = _incarnations[container] = secrets.randbits(64) or 1
    return found


def streams_digest(names: Iterable[str]) -> int:
    """A digest of a set of stream names (order does not matter; 0 for none)."""
    digest = 0
    for name in names:
        h = hashlib.blake2b(name.encode(), digest_size=8).digest()
        digest ^= int.from_bytes(h, "little")
    return digest


def changes_page(
    container: SegmentContainer,
    request: wire.ChangesRequest,
    page_bytes: int = PAGE_BYTES,
) -> wire.ChangesResponse:
    """The answer to one ChangesRequest (one page)."""
    if request.walk:
        return walk_page(container, request, page_bytes)
    answer = _answer(container)
    _add_streams(container, answer, request)
    now = answer.cursor
    cursor = request.cursor
    found = None
    if cursor.incarnation == now.incarnation and cursor.sequence <= now.sequence:
        found = container.changes_since(cursor.sequence)
    if found is None:
        answer.resync = True
        return answer
    changed, deleted = found
    limit = min(request.limit or DEFAULT_LIMIT, MAX_LIMIT)
    # Oldest first, so that a page ends at a sequence the next one goes on from.
    updated: Iterable[_Event] = ((seq, seg, (0, "")) for seq, seg in reversed(changed))
    gone: Iterable[_Event] = ((seq, None, (i, name)) for seq, i, name in reversed(deleted))
    events = heapq.merge(updated, gone, key=lambda e: e[0])
    size = 0
    last = cursor.sequence
    for taken, (seq, seg, (segment_id, name)) in enumerate(events):
        if seq != last and (taken >= limit or size >= page_bytes):
            # Only between sequences: one operation may change two segments
            # (a merge), and the next page starts after `last`.
            answer.cursor.sequence = last
            answer.more = True
            break
        last = seq
        if seg is None:
            if not is_hidden(name):
                answer.deleted.add(id=segment_id, name=name)
                size += len(name) + 16
        elif not seg.hidden:
            record = seg.committed_record()
            answer.records.append(record)
            size += record.ByteSize()
    return answer


def walk_page(
    container: SegmentContainer,
    request: wire.ChangesRequest,
    page_bytes: int = PAGE_BYTES,
) -> wire.ChangesResponse:
    """One page of a walk: the committed records of the segments after ``walk_after``.

    A cold segment's record is its kept bytes, parsed into the answer
    without warming it.
    """
    answer = _answer(container)
    limit = min(request.limit or DEFAULT_LIMIT, MAX_LIMIT)
    size = 0
    for taken, seg in enumerate(container.committed_segments(start_after=request.walk_after)):
        if taken >= limit or size >= page_bytes:
            answer.more = True
            break
        data = seg.cold_record()
        if data is not None:
            answer.records.add().MergeFromString(data)
            size += len(data)
        else:
            record = seg.committed_record()
            answer.records.append(record)
            size += record.ByteSize()
        answer.walk_last = seg.name
    if not answer.more:
        _add_streams(container, answer, request)
    return answer


def _answer(container: SegmentContainer) -> wire.ChangesResponse:
    """An answer carrying the container's cursor now."""
    now = wire.ChangeCursor(incarnation=incarnation(container), sequence=container.applied_seq)
    return wire.ChangesResponse(cursor=now)


def _add_streams(
    container: SegmentContainer, answer: wire.ChangesResponse, request: wire.ChangesRequest
) -> None:
    """The streams' digest, and their names if the asker's digest differs."""
    names = container.stream_names()
    answer.streams_digest = streams_digest(names)
    if answer.streams_digest != request.streams_digest:
        answer.streams_changed = True
        answer.streams.extend(names)
