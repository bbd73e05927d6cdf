"""An append-only B+tree of 16-byte keys to int64 values (Pravega's attribute index, seed 003).

The tree lives in an *attribute segment*: a byte space that only grows at
its end. Pages are appended, never rewritten: an update writes the pages it
changes and their ancestors up to a new root (children before parents, so a
parent knows its children's new offsets). Each index entry records the
lowest page offset in its child's subtree; with *progressive compaction*
every batch also re-appends the live page with the lowest offset (found from
the root by following the smallest ``min_offset``; its ancestors are
rewritten anyway), so the lowest live offset -- the tree's ``start`` -- keeps
moving forward and everything below it can be truncated away.

Page layout (all integers big-endian; docs/FORMATS.md, "Attribute index"):

====== ===================================================================
bytes  field
====== ===================================================================
0-3    magic ``SGAP``
4      version, 1
5      kind: 1 leaf, 2 index
6-7    reserved, 0
8-11   entry count
12-15  CRC32C of the whole page with this field zero
16-    entries (fixed size, by kind), keys strictly ascending
====== ===================================================================

A leaf entry, 24 bytes:

====== ===================================================================
0-15   key
16-23  value, signed int64
====== ===================================================================

An index entry, 32 bytes:

====== ===================================================================
0-15   key: the lowest key of the child's subtree (the first entry's key is
       not used for routing: it stands for minus infinity)
16-21  child page offset, u48
22-23  child page length in bytes, u16
24-31  min_offset, u64: the lowest offset of any page in the child's
       subtree, the child itself included
====== ===================================================================

A page is at most `PAGE_SIZE` bytes (1,364 leaf or 1,023 index entries) and
written at its actual length (header + entries, no padding). A page that
would overflow is split into the fewest pages that fit, entries spread
evenly; underfull pages are not merged; a page whose entries all go is
dropped from its parent; an index root with a single child gives way to that
child. Children always lie before their parents.

Pure and synchronous: pages are read through a ``read(offset, length)``
callable and a batch's pages are returned as bytes for the caller to store.
A parsed page keeps its entries as the bytes they are stored as (a
``bytearray``) beside a tuple of its keys (for `bisect`) and, in an index
page, a tuple of the entries' ``min_offset``; parsed pages are never changed
once stored, so they may be shared (`PageCache`) by every tree and thread --
a batch copies the pages it changes.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import crc32c

PAGE_SIZE = 32 * 1024
KEY_BYTES = 16
HEADER_BYTES = 16
LEAF_ENTRY = 24
INDEX_ENTRY = 32
LEAF = 1
INDEX = 2
MAGIC = b"SGAP"
VERSION = 1

_HEADER = struct.Struct(">4sBBHII")
_VALUE = struct.Struct(">q")
#: Index entry after the key: offset high 16 bits, low 32 bits, length, min_offset.
_CHILD = struct.Struct(">HIHQ")
#: A whole index entry, for parsing a page in one pass.
_INDEX_ENTRY = struct.Struct(">16sHIHQ")
#: A leaf entry's key, for parsing a page in one pass.
_LEAF_KEY = struct.Struct(">16s8x")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_U48_MAX = 2**48 - 1


class IndexCorrupt(Exception):
    """A page that does not parse or does not fit the tree (message names the page offset)."""


@dataclass(frozen=True, slots=True)
class TreeState:
    """Where a tree is: enough to reopen it (what gets journaled)."""

    #: Offset of the root page.
    root_offset: int = 0
    #: Length of the root page; 0 = the empty tree.
    root_length: int = 0
    #: End of the attribute segment: the next page goes here.
    length: int = 0
    #: Truncation offset: no live page lies below it.
    start: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """The pages one update adds, and the tree after it."""

    #: Pages laid out contiguously, to be appended at the old state's ``length``.
    data: bytes
    #: (offset, length) of every page in ``data``, absolute offsets, in order.
    pages: tuple[tuple[int, int], ...]
    #: The tree once ``data`` is stored: the new root; ``length`` = the old
    #: length + ``len(data)``; ``start`` = the lowest offset of any live page.
    state: TreeState
    #: Key changes applied (inserts, updates, removals that found their key).
    changed: int
    #: The pages parsed already (`BTree.commit` caches them).
    parsed: tuple[_Page, ...] = field(default=(), repr=False, compare=False)
    #: Offsets of the pages this batch makes dead: the live pages it
    #: replaces, and any of its own it wrote only to drop (an index root
    #: that gave way to its only child).
    replaced: tuple[int, ...] = ()


class _Page:
    """One parsed page: kind, keys, the entries' bytes back to back, entries' min_offsets.

    Never changed once stored (it may be shared by threads). Its keys and
    min_offsets are tuples then: a tuple of bytes leaves Python's cycle
    collector at the first pass that sees it, where a list of a thousand
    keys would be scanned again by every pass of an older generation (with
    thousands of pages cached, that was 40% of the time of a batch).
    """

    __slots__ = ("data", "keys", "kind", "length", "low", "lows", "offset")

    def __init__(
        self,
        kind: int,
        keys: Sequence[bytes],
        data: bytearray,
        lows: Sequence[int] = (),
    ) -> None:
        self.kind = kind
        self.keys = keys
        self.data = data
        #: Index pages: each entry's min_offset (empty for a leaf).
        self.lows = lows
        #: Where the page is stored (-1: not written yet).
        self.offset = -1
        self.length = 0
        #: Lowest page offset in this page's subtree, itself included (-1: not written yet).
        self.low = -1

    def placed(self, offset: int, length: int) -> None:
        """The page is stored at ``offset``: it knows its subtree's lowest offset now."""
        self.offset = offset
        self.length = length
        self.keys = tuple(self.keys)
        self.lows = tuple(self.lows)
        self.low = min(offset, min(self.lows)) if self.lows else offset

    @property
    def entry(self) -> int:
        return LEAF_ENTRY if self.kind == LEAF else INDEX_ENTRY

    def value(self, i: int) -> int:
        v: int = _VALUE.unpack_from(self.data, i * LEAF_ENTRY + KEY_BYTES)[0]
        return v

    def child(self, i: int) -> tuple[int, int, int]:
        """(offset, length, min_offset) of index entry ``i``."""
        hi, lo, length, low = _CHILD.unpack_from(self.data, i * INDEX_ENTRY + KEY_BYTES)
        return (hi << 32) | lo, length, low

    def route(self, key: bytes) -> int:
        """The child of an index page whose subtree holds ``key``."""
        return max(0, bisect.bisect_right(self.keys, key) - 1)

    def subtree_min(self) -> int:
        """Lowest page offset in this page's subtree (itself included)."""
        return self.low

    def encode(self) -> tuple[bytes, bytearray]:
        """The page's header (with its CRC) and its entries: stored back to back."""
        header = _HEADER.pack(MAGIC, VERSION, self.kind, 0, len(self.keys), 0)
        crc = crc32c.crc32c(self.data, crc32c.crc32c(header))
        return header[:12] + crc.to_bytes(4, "big"), self.data


def _index_entry(page: _Page) -> bytes:
    """The index entry that points at a stored ``page``."""
    offset = page.offset
    return page.keys[0] + _CHILD.pack(offset >> 32, offset & 0xFFFFFFFF, page.length, page.low)


def parse_page(raw: bytes, offset: int) -> _Page:
    """Parse and check one page read from ``offset``; raises IndexCorrupt."""
    if len(raw) < HEADER_BYTES:
        raise IndexCorrupt(f"page at {offset}: {len(raw)} bytes, shorter than a header")
    magic, version, kind, _, count, crc = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise IndexCorrupt(f"page at {offset}: bad magic {magic!r}")
    if version != VERSION:
        raise IndexCorrupt(f"page at {offset}: unknown version {version}")
    if kind not in (LEAF, INDEX):
        raise IndexCorrupt(f"page at {offset}: unknown kind {kind}")
    size = LEAF_ENTRY if kind == LEAF else INDEX_ENTRY
    if HEADER_BYTES + count * size != len(raw):
        raise IndexCorrupt(f"page at {offset}: {count} entries do not fill its {len(raw)} bytes")
    body = memoryview(raw)[HEADER_BYTES:]
    if crc32c.crc32c(body, crc32c.crc32c(raw[:12] + b"\0\0\0\0")) != crc:
        raise IndexCorrupt(f"page at {offset}: CRC32C mismatch")
    if kind == LEAF:
        page = _Page(kind, tuple(k for (k,) in _LEAF_KEY.iter_unpack(body)), bytearray(body))
    else:
        entries = list(_INDEX_ENTRY.iter_unpack(body))
        page = _Page(
            kind, tuple(e[0] for e in entries), bytearray(body), tuple(e[4] for e in entries)
        )
    page.placed(offset, len(raw))
    return page


class PageCache:
    """Parsed pages, least recently used evicted beyond ``budget_bytes`` (page bytes counted).

    Shared by many trees (keyed by (owner, offset)) and threads.
    """

    def __init__(self, budget_bytes: int = 64 * 1024 * 1024) -> None:
        self.budget = budget_bytes
        self._pages: OrderedDict[tuple[Hashable, int], _Page] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, owner: Hashable, offset: int) -> _Page | None:
        """The parsed page, if cached (it becomes the most recently used)."""
        with self._lock:
            page = self._pages.get((owner, offset))
            if page is None:
                self.misses += 1
                return None
            self.hits += 1
            self._pages.move_to_end((owner, offset))
            return page

    def put(self, owner: Hashable, page: _Page) -> None:
        """Keep a parsed page (never changed again)."""
        if page.length > self.budget:
            return
        with self._lock:
            key = (owner, page.offset)
            old = self._pages.pop(key, None)
            if old is not None:
                self._bytes -= old.length
            self._pages[key] = page
            self._bytes += page.length
            while self._bytes > self.budget:
                _, victim = self._pages.popitem(last=False)
                self._bytes -= victim.length

    def drop(self, owner: Hashable) -> None:
        """Forget one tree's pages."""
        with self._lock:
            for key in [k for k in self._pages if k[0] == owner]:
                self._bytes -= self._pages.pop(key).length

    def statistics(self) -> dict[str, int]:
        """hits, misses, pages, bytes."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "pages": len(self._pages),
                "bytes": self._bytes,
            }


def _check_key(key: object) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        raise ValueError(f"attribute key must be {KEY_BYTES} bytes, got {key!r}")
    return bytes(key)


class _Build:
    """One batch being prepared: lays its pages out from ``start`` on, as they are finished."""

    def __init__(self, start: int) -> None:
        self.cursor = start
        self.parts: list[bytes | bytearray] = []
        self.pages: list[_Page] = []
        #: Key changes applied.
        self.changed = 0
        #: Offsets of the pages the batch makes dead.
        self.replaced: list[int] = []

    def emit(self, page: _Page) -> None:
        """Write ``page`` (it learns its offset)."""
        if self.cursor > _U48_MAX:
            raise ValueError("attribute segment past 2**48 bytes")
        header, entries = page.encode()
        length = len(header) + len(entries)
        page.placed(self.cursor, length)
        self.cursor += length
        self.parts += (header, entries)
        self.pages.append(page)

    def find(self, offset: int) -> _Page | None:
        """The page this batch wrote at ``offset``, if any."""
        for page in reversed(self.pages):
            if page.offset == offset:
                return page
        return None


class BTree:
    """An append-only B+tree of 16-byte keys to int64 values (seed 003).

    ``read(offset, length)`` returns the stored bytes of one page (what it
    raises propagates); it is called only for pages not in ``cache`` (a
    private 16 MiB one when None). ``owner`` names the tree in a shared
    cache. ``compaction``: progressive compaction (every batch re-appends
    the live page with the lowest offset). ``max_page``: the page size
    limit (small ones make deep trees, for tests).
    """

    def __init__(
        self,
        state: TreeState,
        read: Callable[[int, int], bytes],
        *,
        cache: PageCache | None = None,
        owner: Hashable = None,
        compaction: bool = True,
        max_page: int = PAGE_SIZE,
    ) -> None:
        if max_page < HEADER_BYTES + 2 * INDEX_ENTRY:
            raise ValueError(f"max_page {max_page} holds fewer than two index entries")
        if max_page > 0xFFFF:
            raise ValueError(f"max_page {max_page}: a page's length must fit in 16 bits")
        self._state = state
        self._read = read
        self._cache = cache if cache is not None else PageCache(16 * 1024 * 1024)
        self._owner = owner
        self.compaction = compaction
        self._leaf_cap = (max_page - HEADER_BYTES) // LEAF_ENTRY
        self._index_cap = (max_page - HEADER_BYTES) // INDEX_ENTRY
        #: Pages read from storage by this tree object (cache misses).
        self.pages_read = 0
        self._pages_written = 0

    @property
    def state(self) -> TreeState:
        """Where the tree is now."""
        return self._state

    def pages_written(self) -> int:
        """Pages in the batches this tree object committed."""
        return self._pages_written

    # -- reading ---------------------------------------------------------------------

    def _load(self, offset: int, length: int) -> _Page:
        page = self._cache.get(self._owner, offset)
        if page is not None:
            return page
        if offset < self._state.start or offset + length > self._state.length:
            raise IndexCorrupt(
                f"page at {offset} lies outside the live attribute segment "
                f"[{self._state.start}, {self._state.length})"
            )
        raw = self._read(offset, length)
        self.pages_read += 1
        if len(raw) != length:
            raise IndexCorrupt(f"page at {offset}: read {len(raw)} bytes, expected {length}")
        page = parse_page(bytes(raw), offset)
        self._cache.put(self._owner, page)
        return page

    def _root(self) -> _Page | None:
        s = self._state
        if not s.root_length:
            return None
        return self._load(s.root_offset, s.root_length)

    def get(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """The values of those ``keys`` the tree holds (absent ones are left out).

        Raises ValueError for a key that is not 16 bytes.
        """
        wanted = sorted({_check_key(k) for k in keys})
        out: dict[bytes, int] = {}
        root = self._root()
        if root is None:
            return out
        for key in wanted:
            page = root
            while page.kind == INDEX:
                offset, length, _ = page.child(page.route(key))
                page = self._load(offset, length)
            i = bisect.bisect_left(page.keys, key)
            if i < len(page.keys) and page.keys[i] == key:
                out[key] = page.value(i)
        return out

    def _items_from(self, page: _Page, start: bytes) -> Iterator[tuple[bytes, int]]:
        if page.kind == LEAF:
            for i in range(bisect.bisect_left(page.keys, start), len(page.keys)):
                yield page.keys[i], page.value(i)
            return
        for i in range(page.route(start), len(page.keys)):
            offset, length, _ = page.child(i)
            yield from self._items_from(self._load(offset, length), start)

    def range(self, start: bytes = b"", limit: int = 0) -> list[tuple[bytes, int]]:
        """Entries with keys >= ``start``, ascending, at most ``limit`` (0: all)."""
        root = self._root()
        out: list[tuple[bytes, int]] = []
        if root is None:
            return out
        for item in self._items_from(root, start):
            out.append(item)
            if limit and len(out) >= limit:
                break
        return out

    def count(self) -> int:
        """How many keys the tree holds (walks every leaf)."""
        root = self._root()
        if root is None:
            return 0
        total = 0
        stack = [root]
        while stack:
            page = stack.pop()
            if page.kind == LEAF:
                total += len(page.keys)
            else:
                for i in range(len(page.keys)):
                    offset, length, _ = page.child(i)
                    stack.append(self._load(offset, length))
        return total

    # -- writing ---------------------------------------------------------------------

    def _lowest_path(self, root: _Page) -> list[int]:
        """Child indexes from the root to the live page with the lowest offset."""
        path: list[int] = []
        page = root
        while page.kind == INDEX:
            lows = page.lows
            low = min(lows)
            if low >= page.offset:
                break  # the page itself (children lie before parents: not in a sound tree)
            i = lows.index(low)
            path.append(i)
            offset, length, _ = page.child(i)
            page = self._load(offset, length)
        return path

    def prepare(self, changes: Mapping[bytes, int | None]) -> Batch:
        """The batch that applies ``changes`` (None: remove the key); the tree is unchanged.

        Raises ValueError for a key that is not 16 bytes or a value that is
        not a signed 64-bit integer. A batch that changes no key (no
        changes, or only removals of absent keys) writes nothing.
        """
        items: list[tuple[bytes, int | None]] = []
        for key, value in changes.items():
            if value is not None and (
                not isinstance(value, int) or not _INT64_MIN <= value <= _INT64_MAX
            ):
                raise ValueError(f"value {value!r} is not a signed 64-bit integer")
            items.append((_check_key(key), value))
        items.sort()
        state = self._state
        if not items:
            return Batch(b"", (), state, 0)
        build = _Build(state.length)
        root = self._root()
        if root is None:
            pages = self._apply(build, _Page(LEAF, (), bytearray()), items, None)
        else:
            force = self._lowest_path(root) if self.compaction else None
            pages = self._apply(build, root, items, force)
            build.replaced.append(root.offset)
        if not build.changed:
            return Batch(b"", (), state, 0)
        if not pages:
            # Every key went: the empty tree (nothing live, all of it truncatable).
            end = build.cursor
            return self._batch(build, TreeState(0, 0, end, end))
        for page in pages:
            build.emit(page)
        level = pages
        while len(level) > 1:
            # The root split: new index levels above, split again if too wide.
            up = []
            for lo, hi in _even_bounds(len(level), self._index_cap):
                group = level[lo:hi]
                page = _Page(
                    INDEX,
                    [p.keys[0] for p in group],
                    bytearray(b"".join(_index_entry(p) for p in group)),
                    [p.low for p in group],
                )
                build.emit(page)
                up.append(page)
            level = up
        top = level[0]
        root_offset, root_length = top.offset, top.length
        # An index root with one child gives way to it, repeatedly. The page
        # given up is dead at once (even one this batch wrote).
        while top.kind == INDEX and len(top.keys) == 1:
            build.replaced.append(top.offset)
            root_offset, root_length, _ = top.child(0)
            top = build.find(root_offset) or self._load(root_offset, root_length)
        return self._batch(build, TreeState(root_offset, root_length, build.cursor, top.low))

    @staticmethod
    def _batch(build: _Build, state: TreeState) -> Batch:
        return Batch(
            b"".join(build.parts),
            tuple((p.offset, p.length) for p in build.pages),
            state,
            build.changed,
            tuple(build.pages),
            tuple(sorted(set(build.replaced))),
        )

    def _apply(
        self,
        build: _Build,
        page: _Page,
        items: list[tuple[bytes, int | None]],
        force: list[int] | None,
    ) -> list[_Page]:
        """The pages (not yet written) that replace ``page`` after ``items``.

        ``[page]`` itself when nothing below it changes. ``force``: the path
        (child indexes) below this page to the page progressive compaction
        re-appends ([] = this page), or None. The children that change are
        written (``build``) before this returns.
        """
        if page.kind == LEAF:
            # The keys are shared with the old page until one comes or goes
            # (updates, the common case, copy only the entries' bytes).
            keys: Sequence[bytes] = page.keys
            grown: list[bytes] | None = None
            data = bytearray(page.data)
            changed = 0
            for key, value in items:
                i = bisect.bisect_left(keys, key)
                p = i * LEAF_ENTRY
                if i < len(keys) and keys[i] == key:
                    if value is None:
                        if grown is None:
                            keys = grown = list(keys)
                        del grown[i]
                        del data[p : p + LEAF_ENTRY]
                    else:
                        _VALUE.pack_into(data, p + KEY_BYTES, value)
                    changed += 1
                elif value is not None:
                    if grown is None:
                        keys = grown = list(keys)
                    grown.insert(i, key)
                    data[p:p] = key + _VALUE.pack(value)
                    changed += 1
            build.changed += changed
            if not changed and force is None:
                return [page]  # only absent keys removed: nothing to rewrite
            if not keys:
                return []
            return self._split(_Page(LEAF, keys, data), self._leaf_cap)
        # An index page: hand each child its items; rewrite the children that change.
        groups: dict[int, list[tuple[bytes, int | None]]] = {}
        n = len(page.keys)
        i = 0
        for item in items:
            # Items are sorted: the next one's child is this one's or a later one.
            i = max(0, bisect.bisect_right(page.keys, item[0], i, n) - 1)
            groups.setdefault(i, []).append(item)
        forced_child = force[0] if force else None
        if forced_child is not None and forced_child not in groups:
            groups[forced_child] = []
        if not groups and force is None:
            return [page]
        keys = page.keys  # shared until a child's lowest key changes or children come or go
        grown = None
        lows = list(page.lows)
        data = bytearray(page.data)
        shift = 0  # entries added (or removed, < 0) before the next child so far
        rewritten = False
        for i in sorted(groups):
            offset, length, _ = page.child(i)
            child = self._load(offset, length)
            sub_force = force[1:] if force and i == forced_child else None
            replaced = self._apply(build, child, groups[i], sub_force)
            if len(replaced) == 1 and replaced[0] is child:
                continue  # unchanged
            rewritten = True
            build.replaced.append(offset)
            j = i + shift
            if len(replaced) == 1:
                rp = replaced[0]
                build.emit(rp)
                if rp.keys[0] != keys[j]:
                    if grown is None:
                        keys = grown = list(keys)
                    grown[j] = rp.keys[0]
                lows[j] = rp.low
                data[j * INDEX_ENTRY : (j + 1) * INDEX_ENTRY] = _index_entry(rp)
                continue
            # The child split, or went.
            if grown is None:
                keys = grown = list(keys)
            for rp in replaced:
                build.emit(rp)
            grown[j : j + 1] = [rp.keys[0] for rp in replaced]
            lows[j : j + 1] = [rp.low for rp in replaced]
            data[j * INDEX_ENTRY : (j + 1) * INDEX_ENTRY] = b"".join(
                [_index_entry(rp) for rp in replaced]
            )
            shift += len(replaced) - 1
        if not rewritten and force is None:
            return [page]
        if not keys:
            return []
        return self._split(_Page(INDEX, keys, data, lows), self._index_cap)

    def _split(self, page: _Page, cap: int) -> list[_Page]:
        """``page`` as the fewest pages of at most ``cap`` entries, spread evenly."""
        n = len(page.keys)
        if n <= cap:
            return [page]
        size = page.entry
        return [
            _Page(page.kind, page.keys[lo:hi], page.data[lo * size : hi * size], page.lows[lo:hi])
            for lo, hi in _even_bounds(n, cap)
        ]

    def commit(self, batch: Batch) -> None:
        """Adopt the batch's state (the caller stored ``batch.data``); cache its pages."""
        if batch.parsed:
            for page in batch.parsed:
                self._cache.put(self._owner, page)
        else:
            base = batch.state.length - len(batch.data)
            for offset, length in batch.pages:
                rel = offset - base
                self._cache.put(self._owner, parse_page(batch.data[rel : rel + length], offset))
        self._pages_written += len(batch.pages)
        self._state = batch.state

    # -- fsck ---------------------------------------------------------------------------

    def verify(self) -> list[str]:
        """Every problem of the live tree, as text naming page offsets ([] when healthy).

        Reads every live page from storage (not the cache): each must parse
        (magic, version, kind, length, CRC); keys strictly ascending within
        a page and within the key range its parent gives it; every index
        entry's min_offset the true lowest offset of its child's subtree;
        children before their parents; every leaf at the same depth; no
        live page below ``start`` or reaching past ``length``.
        """
        s = self._state
        problems: list[str] = []
        if s.start > s.length:
            problems.append(f"truncation offset {s.start} is past the end {s.length}")
        if not s.root_length:
            return problems
        leaf_depths: set[int] = set()

        def walk(
            offset: int, length: int, lo: bytes | None, hi: bytes | None, depth: int
        ) -> int | None:
            """The subtree's lowest page offset, or None if it could not be read."""
            if offset < s.start:
                problems.append(f"live page at {offset} lies below the truncation offset {s.start}")
                return None
            if offset + length > s.length:
                problems.append(
                    f"page at {offset} ends past the attribute segment's end {s.length}"
                )
                return None
            try:
                page = parse_page(bytes(self._read(offset, length)), offset)
            except IndexCorrupt as e:
                problems.append(str(e))
                return None
            keys = page.keys
            if any(keys[i] >= keys[i + 1] for i in range(len(keys) - 1)):
                problems.append(f"page at {offset}: keys not strictly ascending")
            if not keys:
                problems.append(f"page at {offset}: no entries")
                return offset
            first = 1 if page.kind == INDEX else 0
            if lo is not None and any(k < lo for k in keys[first:]):
                problems.append(f"page at {offset}: a key below its parent's range")
            if hi is not None and any(k >= hi for k in keys):
                problems.append(f"page at {offset}: a key at or above its parent's range")
            if page.kind == LEAF:
                leaf_depths.add(depth)
                return offset
            low = offset
            for i in range(len(keys)):
                c_off, c_len, c_low = page.child(i)
                if c_off + c_len > offset:
                    # Also what keeps a damaged tree from sending this walk in circles.
                    problems.append(
                        f"page at {offset}: entry {i} points at {c_off}, not before the page"
                    )
                    continue
                c_lo = keys[i] if i else lo
                c_hi = keys[i + 1] if i + 1 < len(keys) else hi
                got = walk(c_off, c_len, c_lo, c_hi, depth + 1)
                if got is not None and got != c_low:
                    problems.append(
                        f"page at {offset}: entry {i} records lowest offset {c_low}, "
                        f"its subtree's is {got}"
                    )
                low = min(low, c_low if got is None else got)
            return low

        low = walk(s.root_offset, s.root_length, None, None, 0)
        if low is not None and low < s.start:
            problems.append(f"a live page at {low} lies below the truncation offset {s.start}")
        if len(leaf_depths) > 1:
            problems.append(
                f"leaves at different depths {sorted(leaf_depths)} below the root at "
                f"{s.root_offset}"
            )
        return problems


def _even_bounds(n: int, cap: int) -> list[tuple[int, int]]:
    parts = -(-n // cap)
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]
