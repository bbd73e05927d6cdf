"""The change feed: a container's changes since a cursor, page by page, and a
follower (`RemoteNode`) that follows it instead of listing the owner in full.

On a container with its journal in memory; the same over real daemons and
their mounts is in tests/test_cluster_feed.py.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import trio

from gateway.client.client import open_client
from gateway.cluster import feed
from gateway.cluster.remote import MountIds, RemoteNode
from gateway.container import table as table_module
from gateway.container.segment import Segment
from gateway.container.streams import TXN_DIR
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.metadata_pb2 import ChunkRecord, SegmentRecord
from gateway.server import hello
from gateway.server.registry import HANDLERS
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from tests.helpers.container import DirectContainer
from tests.helpers.inprocess import served
from tests.helpers.segments import make_config
from tests.test_container_unit import make, restart

pytestmark = pytest.mark.timeout(60)


def ask(
    c: Any,
    cursor: wire.ChangeCursor | None,
    limit: int = 0,
    digest: int = 0,
    walk_after: str | None = None,
    page_bytes: int = feed.PAGE_BYTES,
) -> Any:
    request = wire.ChangesRequest(cursor=cursor, limit=limit, streams_digest=digest)
    if walk_after is not None:
        request.walk, request.walk_after = True, walk_after
    return feed.changes_page(c, request, page_bytes)


def follow(
    c: Any, cursor: wire.ChangeCursor, limit: int
) -> tuple[list[SegmentRecord], list[str], wire.ChangeCursor, int]:
    """Every page from ``cursor``: records, deleted names, the last cursor, pages."""
    records: list[SegmentRecord] = []
    deleted: list[str] = []
    pages = 0
    while True:
        page = ask(c, cursor, limit)
        pages += 1
        assert not page.resync
        assert len(page.records) + len(page.deleted) <= limit
        records += page.records
        deleted += [d.name for d in page.deleted]
        cursor = page.cursor
        if not page.more:
            return records, deleted, cursor, pages


async def test_changes_are_served_page_by_page_from_a_cursor() -> None:
    c = make()
    for i in range(30):
        await c.create(f"s/{i:02}")
    first = ask(c, None)
    assert first.resync and first.cursor.sequence == c.applied_seq
    assert first.cursor.incarnation == feed.incarnation(c) != 0
    cursor = first.cursor
    assert follow(c, cursor, 4)[:2] == ([], [])  # nothing changed
    await c.append("s/03", b"abc")
    await c.append("s/07", b"defg")
    await c.append("s/03", b"h")
    await c.seal("s/07")
    await c.truncate("s/03", 2)
    for i in range(10, 20):
        await c.append(f"s/{i:02}", b"x" * i)
    await c.delete("s/25")
    await c.delete("s/26")
    await c.create("s/26")  # a name deleted and created again: a new id
    txn = (await c.begin("s/01")).name
    await c.append(txn, b"in a transaction")
    records, deleted, end, pages = follow(c, cursor, 4)
    assert pages == 4  # 14 changes (the transaction's is left out after counting)
    assert end.sequence == c.applied_seq and end.incarnation == cursor.incarnation
    names = [r.name for r in records]
    want = ["s/07", "s/03"] + [f"s/{i}" for i in range(10, 20)] + ["s/26"]
    assert names == want  # in the order of their last change, each once
    assert all(not r.name.startswith(TXN_DIR) for r in records)
    assert deleted == ["s/25", "s/26"]
    for r in records:
        assert r == c.record(r.name)  # what get_record answers
    seven = {r.name: r for r in records}["s/07"]
    assert seven.sealed and seven.length == 4
    three = {r.name: r for r in records}["s/03"]
    assert three.start_offset == 2 and three.length == 4
    # From the end: nothing more; a commit changes its parent.
    assert follow(c, end, 4)[:2] == ([], [])
    await c.commit(txn)
    await c.wait_settled()
    records, deleted, end, _ = follow(c, end, 100)
    assert [r.name for r in records] == ["s/01"] and deleted == []


async def test_a_cursor_it_cannot_answer_is_told_to_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = MemoryJournal()
    c = make(journal)
    for name in ("a", "b", "c", "d", "e"):
        await c.create(name)
    cursor = ask(c, None).cursor
    await c.append("a", b"1")
    ahead = wire.ChangeCursor(incarnation=cursor.incarnation, sequence=c.applied_seq + 1)
    other = wire.ChangeCursor(incarnation=cursor.incarnation ^ 1, sequence=cursor.sequence)
    for bad in (None, wire.ChangeCursor(), ahead, other):
        page = ask(c, bad)
        assert page.resync and not page.records and not page.deleted
        assert page.cursor.sequence == c.applied_seq
    assert not ask(c, cursor).resync
    # Another run of the same journal: another incarnation, whatever its sequence.
    again = restart(journal)
    assert again.applied_seq == c.applied_seq
    page = ask(again, cursor)
    assert page.resync and page.cursor.incarnation not in (0, cursor.incarnation)
    # Older than the deletions the table keeps.
    monkeypatch.setattr(table_module, "KEEP_DELETIONS", 2)
    old = ask(again, None).cursor
    for name in ("b", "c", "d"):
        await again.delete(name)
    assert ask(again, old).resync


async def test_stream_names_come_when_they_changed() -> None:
    c = make()
    cursor = ask(c, None).cursor
    page = ask(c, cursor)
    assert page.streams_digest == 0 and not page.streams_changed
    await c.create_stream("logs", {})
    page = ask(c, cursor)
    assert page.streams_changed and list(page.streams) == ["logs"]
    assert page.streams_digest == feed.streams_digest(["logs"]) != 0
    held = page.streams_digest
    page = ask(c, page.cursor, digest=held)
    assert not page.streams_changed and not page.streams
    await c.create_stream("more", {})
    await c.delete_stream("logs")
    page = ask(c, page.cursor, digest=held)
    assert page.streams_changed and list(page.streams) == ["more"]
    assert feed.streams_digest(["a", "b"]) == feed.streams_digest(["b", "a"])


class Changes:
    """A container as the feed sees it, with changes made up (two at one sequence)."""

    def __init__(self) -> None:
        self.applied_seq = 10
        self.log: list[tuple[int, Segment]] = []

    def stream_names(self) -> list[str]:
        return []

    def changes_since(self, seq: int) -> Any:
        newest_first = [(s, seg) for s, seg in reversed(self.log) if s > seq]
        return newest_first, []


def test_a_page_never_splits_one_operations_changes() -> None:
    c = Changes()
    for seq, rid in ((4, 1), (5, 2), (5, 3), (6, 4)):  # a merge changed 2 and 3 at 5
        c.log.append((seq, Segment.from_record(SegmentRecord(id=rid, name=f"s{rid}"))))
    cursor = wire.ChangeCursor(incarnation=feed.incarnation(c), sequence=0)  # type: ignore[arg-type]
    got = []
    pages = []
    while True:
        page = ask(c, cursor, limit=1)
        pages.append([r.name for r in page.records])
        got += [r.name for r in page.records]
        cursor = page.cursor
        if not page.more:
            break
    assert pages == [["s1"], ["s2", "s3"], ["s4"]]
    assert got == ["s1", "s2", "s3", "s4"] and cursor.sequence == 10


async def sealed_in_tier2(c: DirectContainer, count: int) -> None:
    """Segments s/00, s/01, ... of 1, 2, ... bytes, sealed and wholly in Tier 2."""
    for i in range(count):
        name = f"s/{i:02}"
        await c.create(name)
        await c.append(name, b"x" * (i + 1))
        await c.prepare_chunk_added(
            c.info(name).id, ChunkRecord(name=f"c{i}", start_offset=0, length=i + 1), False
        ).wait()
        await c.seal(name)
        await c.prepare_storage_sealed(c.info(name).id).wait()


class Owner:
    """A client of a container, as a follower uses one (the requests counted)."""

    def __init__(
        self, container: DirectContainer, feed_served: bool = True, walks: bool = True
    ) -> None:
        self.c = container
        self.feed_served = feed_served
        #: False: an owner older than walks (it answers a walk "resync").
        self.walks = walks
        #: Called before each walk page is made (the owner changing meanwhile).
        self.between_pages: Any = None
        self.asked: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.asked[kind] = self.asked.get(kind, 0) + 1

    def serves(self, kind: str) -> bool:
        return self.feed_served and kind == feed.FEATURE

    async def changes(
        self,
        cursor: wire.ChangeCursor | None = None,
        limit: int = 0,
        streams_digest: int = 0,
        walk_after: str | None = None,
    ) -> wire.ChangesResponse:
        assert self.feed_served
        if walk_after is not None:
            self._count("walk")
            if self.between_pages is not None:
                await self.between_pages(walk_after)
            if not self.walks:
                walk_after = None  # an older owner reads the request without its walk
            return ask(self.c, cursor, 7, streams_digest, walk_after)
        self._count("changes")
        return ask(self.c, cursor, limit or 7, streams_digest)

    async def list(self, prefix: str = "", local_only: bool = False) -> list[Any]:
        self._count("list")
        return self.c.list(prefix)

    async def record(self, name: str) -> SegmentRecord:
        self._count("get_record")
        return self.c.record(name)

    async def stream_names(self) -> list[str]:
        self._count("stream")
        return self.c.stream_names()


def view_of(node: RemoteNode) -> dict[str, tuple[int, int, bool]]:
    return {s.name: (s.start_offset, s.length, s.sealed) for s in node.segments.values()}


def owner_view(c: DirectContainer) -> dict[str, tuple[int, int, bool]]:
    return {i.name: (i.start_offset, i.length, i.sealed) for i in c.list()}


@pytest.mark.parametrize("feed_served", [True, False], ids=["feed", "old owner"])
async def test_a_follower_follows_the_feed_and_resyncs(feed_served: bool) -> None:
    journal = MemoryJournal()
    c = make(journal)
    node = RemoteNode("other", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c, feed_served)
    client: Any = owner
    for i in range(20):
        await c.create(f"s/{i:02}")
        await c.append(f"s/{i:02}", b"x" * i)
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c)
    await c.append("s/01", b"more")
    await c.seal("s/02")
    await c.truncate("s/03", 2)
    await c.delete("s/04")
    old_five = node.by_name("s/05")
    await c.delete("s/05")
    await c.create("s/05")
    await c.append("s/05", b"again")
    await c.create_stream("logs", {})
    for i in range(20, 30):
        await c.create(f"s/{i:02}")  # more than one page
    txn = (await c.begin("s/06")).name
    await c.append(txn, b"t")
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c)
    new_five = node.by_name("s/05")
    assert old_five is not None and new_five is not None and new_five.id != old_five.id
    assert node.streams == {"logs"}
    assert (node.listings, node.walks) == ((0, 1) if feed_served else (2, 0))
    # A restarted owner: another incarnation, so one walk, then the feed.
    c = restart(journal)
    owner.c = c
    await c.append("s/07", b"after the restart")
    await node.refresh_live(client)
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c)
    assert (node.listings, node.walks) == ((0, 2) if feed_served else (4, 0))
    assert node.refreshes == 4


async def test_a_followers_requests_do_not_grow_with_unchanged_segments() -> None:
    """What one refresh asks of the owner when one segment changed: with the feed
    the same for 10 and 2,000 segments; with listings, a listing of them all."""
    asked = {}
    for feed_served in (True, False):
        for count in (10, 2000):
            c = make()
            for i in range(count):
                await c.create(f"s/{i:05}")
            node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None,
                              MountIds())  # fmt: skip
            owner = Owner(c, feed_served)
            client: Any = owner
            await node.refresh_live(client)
            before = (dict(owner.asked), node.records_fetched + node.feed_records)
            await c.append("s/00001", b"new")
            await node.refresh_live(client)
            assert view_of(node)["s/00001"] == (0, 3, False)
            after = (owner.asked, node.records_fetched + node.feed_records)
            requests = {k: n - before[0].get(k, 0) for k, n in after[0].items()}
            asked[feed_served, count] = ({k: n for k, n in requests.items() if n},
                                         after[1] - before[1])  # fmt: skip
    assert asked[True, 10] == asked[True, 2000] == ({"changes": 1}, 1)
    assert asked[False, 10] == ({"list": 1, "get_record": 1, "stream": 1}, 1)
    assert asked[False, 2000] == asked[False, 10]  # in requests; a listing of 2,000 names


async def test_a_rejected_record_from_the_feed_keeps_the_segment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = make()
    await c.create("a")
    await c.append("a", b"12345")
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c)
    client: Any = owner
    await node.refresh_live(client)

    real = feed.changes_page

    def broken(container: Any, request: Any, page_bytes: int = feed.PAGE_BYTES) -> Any:
        page = real(container, request, page_bytes)
        for r in page.records:
            r.storage_length = r.length + 10  # breaks storage_length <= length
        return page

    await c.append("a", b"678")
    monkeypatch.setattr(feed, "changes_page", broken)
    await node.refresh_live(client)
    seg = node.by_name("a")
    assert seg is not None and seg.length == 5  # the last good record stands
    assert node.rejections.bad_now() == {"segment record from node o": 1}


def test_a_page_stops_growing_past_its_bytes() -> None:
    c = Changes()
    for seq in range(1, 6):
        record = SegmentRecord(id=seq, name=f"{seq}" * 100)  # about 100 bytes each
        c.log.append((seq, Segment.from_record(record)))
    cursor = wire.ChangeCursor(incarnation=feed.incarnation(c), sequence=0)  # type: ignore[arg-type]
    request = wire.ChangesRequest(cursor=cursor, limit=1000)
    page = feed.changes_page(c, request, page_bytes=250)  # type: ignore[arg-type]
    assert [r.id for r in page.records] == [1, 2, 3] and page.more  # one past the bound
    assert page.cursor.sequence == 3
    request.cursor.sequence = 3
    page = feed.changes_page(c, request, page_bytes=250)  # type: ignore[arg-type]
    assert [r.id for r in page.records] == [4, 5] and not page.more


@pytest.mark.parametrize("feed_served", [True, False], ids=["feed", "old server"])
async def test_a_follower_over_the_protocol_uses_the_feed_only_where_served(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, feed_served: bool
) -> None:
    """A server that does not name "changes" in Hello (an older version) is listed
    at every refresh, over the same connection; one that does is followed."""
    if not feed_served:
        monkeypatch.setattr(hello, "FEATURES", ())
        monkeypatch.delitem(HANDLERS, "changes")  # asked anyway, it would fail the test
    async with served(make_config(tmp_path)) as s, open_client(s.address) as client:
        assert client.serves("changes") == feed_served
        c = s.container
        for i in range(5):
            await c.create(f"p/{i}")
        node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
        for i in range(3):
            await c.append("p/1", b"x" * (i + 1))
            await c.delete(f"p/{i + 2}")
            await node.refresh_live(client)
            assert view_of(node) == owner_view(c)
        assert node.listings == (0 if feed_served else 3)
        assert (node.walk_pages, node.feed_requests) == ((1, 2) if feed_served else (0, 0))
        assert s.server.requests.get("changes", 0) == node.feed_requests + node.walk_pages
        assert s.server.requests.get("list", 0) == node.listings


async def test_a_stream_deleted_goes_after_its_segments_across_pages() -> None:
    c = make()
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    seen: list[tuple[str, str]] = []

    class Watch:
        def on_created(self, seg: Segment) -> None: ...
        def on_sealed(self, seg: Segment) -> None: ...
        def on_truncated(self, seg: Segment) -> None: ...
        def on_deleted(self, seg: Segment) -> None:
            seen.append(("deleted", seg.name))

        def on_stream_created(self, name: str) -> None:
            seen.append(("stream created", name))

        def on_stream_deleted(self, name: str) -> None:
            seen.append(("stream deleted", name))

    node.watchers.append(Watch())  # type: ignore[arg-type]
    owner = Owner(c)
    client: Any = owner
    await node.refresh_live(client)
    await c.create_stream("logs", {})
    for _ in range(10):
        await c.append("logs", b"event\n")
        await c.roll("logs")
    await node.refresh_live(client)
    assert seen == [("stream created", "logs")] and len(node.segments) == 10
    await c.delete_stream("logs")
    await node.refresh_live(client)  # pages of 7 changes
    assert owner.asked["walk"] == 1 and owner.asked["changes"] >= 2 + 2
    assert not node.segments and not node.streams
    assert seen[-1] == ("stream deleted", "logs") and len(seen) == 1 + 10 + 1


async def test_a_followers_sealed_flushed_segments_stay_cold_until_read() -> None:
    """The follower keeps another node's segments that are sealed and in Tier 2
    cold (their records only), counts their bytes without warming them, and
    shows the same view once read."""
    c = make()
    node = RemoteNode("other", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    await sealed_in_tier2(c, 10)
    await c.create("active")
    await node.refresh_live(Owner(c, True))
    segs = list(node.segments.values())
    assert sum(s.cold for s in segs) == 10 and len(segs) == 11
    assert node.total_blocks == 10  # one 4 KiB block each
    assert all(s.cold for s in segs if s.name != "active")
    assert view_of(node) == owner_view(c)  # read: warm, and the same


async def test_a_walk_sees_every_change_made_between_its_pages() -> None:
    """Changes made while a follower walks -- behind the walk and ahead of it --
    are in its view once it follows from the walk's first cursor."""
    c = make()
    for i in range(40):
        await c.create(f"s/{i:02}")
        await c.append(f"s/{i:02}", b"x" * i)
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c)
    pages: list[str] = []

    async def change(after: str) -> None:
        pages.append(after)
        if len(pages) == 3:  # two pages (14 names) walked
            await c.delete("s/03")  # behind the walk
            await c.append("s/05", b"behind")
            await c.create("s/00a")  # a new name behind it
            await c.delete("s/30")  # ahead of it
            await c.create("s/30")  # ... and again, under a new id
            await c.seal("s/31")
            await c.create("t/new")  # a new name ahead

    owner.between_pages = change
    client: Any = owner
    await node.refresh_live(client)
    assert len(pages) == 6 and node.walks == 1  # 14 names, then 27 after them, 7 a page
    walked = view_of(node)
    # Ahead of the walk: seen at once. Behind it: next time.
    assert walked["t/new"] == (0, 0, False) and walked["s/31"][2] and "s/00a" not in walked
    assert walked["s/03"] == (0, 3, False) and walked["s/30"] == (0, 0, False)
    owner.between_pages = None
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c) and node.walks == 1
    assert owner.asked["changes"] == 1  # the changes since the walk's first page


async def test_an_owner_older_than_walks_is_listed_then_followed() -> None:
    c = make()
    for i in range(10):
        await c.create(f"s/{i:02}")
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c, walks=False)
    client: Any = owner
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c)
    assert (node.walks, node.listings, owner.asked["get_record"]) == (1, 1, 10)
    await c.append("s/01", b"new")
    await node.refresh_live(client)
    assert view_of(node) == owner_view(c) and node.listings == 1  # the feed after it


async def test_an_owner_restarted_while_walked_is_walked_again() -> None:
    journal = MemoryJournal()
    c = make(journal)
    for i in range(20):
        await c.create(f"s/{i:02}")
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c)
    restarted: list[DirectContainer] = []

    async def restart_once(after: str) -> None:
        if after and not restarted:
            restarted.append(restart(journal))
            owner.c = restarted[0]
            await owner.c.delete("s/01")  # behind the walk, in the new run
            await owner.c.create("s/01a")

    owner.between_pages = restart_once
    client: Any = owner
    await node.refresh_live(client)
    assert node.walks == 2 and view_of(node) == owner_view(owner.c)
    owner.between_pages = None
    await owner.c.append("s/02", b"after")
    await node.refresh_live(client)
    assert view_of(node) == owner_view(owner.c) and node.walks == 2


async def test_a_walk_page_stops_at_its_bytes_and_leaves_cold_segments_cold() -> None:
    c = make()
    await sealed_in_tier2(c, 30)
    table = c._table
    assert table.cool(list(table.by_id.values()), set(), table.seq) == 30
    one = ask(c, None, 0, 0, "").records[0].ByteSize()
    names: list[str] = []
    after = ""
    while True:
        page = ask(c, None, 1000, 0, after, page_bytes=5 * one)
        assert not page.resync and not page.deleted and len(page.records) <= 6
        names += [r.name for r in page.records]
        if not page.more:
            break
        after = page.walk_last
    assert names == sorted(f"s/{i:02}" for i in range(30))
    assert all(s.cold for s in table.by_id.values())  # read from their kept bytes


async def test_a_walk_again_keeps_the_sleeping_segments_it_holds() -> None:
    """After a reconnect the follower walks again: a cold segment whose record is
    unchanged stays the object it was (no watcher hears of it); one deleted and
    created again under its name is replaced."""
    c = make()
    await sealed_in_tier2(c, 10)
    node = RemoteNode("other", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c)
    await node.refresh_live(owner)  # type: ignore[arg-type]
    held = {s.name: s for s in node.segments.values()}
    assert all(s.cold for s in held.values())
    await c.delete("s/04")
    await c.create("s/04")
    node._cursor = None  # as `attach` does
    await node.refresh_live(owner)  # type: ignore[arg-type]
    assert node.walks == 2 and view_of(node) == owner_view(c)
    now = {s.name: s for s in node.segments.values()}
    assert [n for n in held if now[n] is not held[n]] == ["s/04"]


async def test_the_deadline_bounds_each_request_of_a_walk_not_the_whole_walk() -> None:
    """A walk longer than the deadline ends, when each page comes within it (a
    first sync of 10^6 segments takes ~20 s: bounded as a whole, it was given
    up and begun again forever); one page that does not come fails it."""
    c = make()
    for i in range(50):
        await c.create(f"s/{i:02}")
    node = RemoteNode("o", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = Owner(c)
    pause = 0.15

    async def slow(after: str) -> None:
        await trio.sleep(pause)

    owner.between_pages = slow
    started = trio.current_time()
    await node.refresh_live(owner, deadline=0.5)  # type: ignore[arg-type]
    assert trio.current_time() - started > 1.0 and node.walk_pages == 8  # 50 names, 7 a page
    assert view_of(node) == owner_view(c)
    pause = 5.0
    node._cursor = None
    with pytest.raises(trio.TooSlowError):
        await node.refresh_live(owner, deadline=0.5)  # type: ignore[arg-type]
