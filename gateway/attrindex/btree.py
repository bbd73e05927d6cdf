"""An append-only B+tree of 16-byte keys to int64 values (Pravega's attribute index, seed 003).

The tree lives in an *attribute segment*: a byte space that only grows at
its end. Pages are appended, never rewritten: an update writes the pages it
changes and their ancestors up to a new root (children before parents, so a
parent knows its children's new offsets). Each index entry records the
lowest page offset in its child's subtree; with *progressive compaction*
every batch also re-appends the live page with the lowest offset (and, with
it, its ancestors), so the lowest live offset -- the tree's ``start`` --
keeps moving forward and everything below it can be truncated away.

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
16-    entries, keys strictly ascending
====== ===================================================================

A leaf entry is key (16) | value (int64, 8): 24 bytes. An index entry is
key (16: the lowest key of the child's subtree; the first entry's key is
not used for routing) | child page offset (u48) | child page length (u16) |
min_offset (u64: the lowest offset of any page in the child's subtree, the
child included): 32 bytes. A page is at most `PAGE_SIZE` bytes and written
at its actual length. A page that would overflow is split into the fewest
pages that fit, entries spread evenly; underfull pages are not merged; a
page whose entries all go is dropped from its parent; an index root with a
single child gives way to that child.

Pure: pages are read through a ``read(offset, length)`` callable and a
batch's pages are returned as bytes for the caller to store. Parsed pages
are immutable once built and may be shared (`PageCache`) by every tree and
thread; a batch copies the pages it changes.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
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
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_U48_MAX = 2**48 - 1


class IndexCorrupt(Exception):
    """A page that does not parse or does not fit the tree (message names the page offset)."""


@dataclass(frozen=True, slots=True)
class TreeState:
    """Where a tree is: enough to reopen it (what gets journaled)."""

    root_offset: int = 0
    #: 0 = the empty tree.
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
    #: (offset, length) of every page in ``data``, absolute offsets.
    pages: tuple[tuple[int, int], ...]
    #: The tree once ``data`` is stored.
    state: TreeState
    #: Key changes applied (inserts, updates, removals that found their key).
    changed: int
    #: The pages parsed already (`BTree.commit` caches them).
    parsed: tuple[_Page, ...] = field(default=(), repr=False, compare=False)
    #: Offsets of the live pages this batch replaces (dead once it is stored).
    replaced: tuple[int, ...] = ()


class _Page:
    """One parsed page: kind, keys, and the entries' bytes back to back."""

    __slots__ = ("data", "keys", "kind", "length", "offset")

    def __init__(self, kind: int, keys: list[bytes], data: bytearray) -> None:
        self.kind = kind
        self.keys = keys
        self.data = data
        #: Where the page is stored (-1: not written yet).
        self.offset = -1
        self.length = 0

    @property
    def entry(self) -> int:
        return LEAF_ENTRY if self.kind == LEAF else INDEX_ENTRY

    def copy(self) -> _Page:
        return _Page(self.kind, list(self.keys), bytearray(self.data))

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
        low = self.offset
        if self.kind == INDEX:
            for i in range(len(self.keys)):
                low = min(low, self.child(i)[2])
        return low

    def encode(self) -> bytes:
        header = _HEADER.pack(MAGIC, VERSION, self.kind, 0, len(self.keys), 0)
        body = header + bytes(self.data)
        crc = crc32c.crc32c(body)
        return body[:12] + crc.to_bytes(4, "big") + body[16:]


def _index_entry(key: bytes, offset: int, length: int, low: int) -> bytes:
    return key + _CHILD.pack(offset >> 32, offset & 0xFFFFFFFF, length, low)


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
    if crc32c.crc32c(raw[:12] + b"\0\0\0\0" + raw[16:]) != crc:
        raise IndexCorrupt(f"page at {offset}: CRC32C mismatch")
    data = bytearray(raw[HEADER_BYTES:])
    keys = [bytes(data[i : i + KEY_BYTES]) for i in range(0, count * size, size)]
    page = _Page(kind, keys, data)
    page.offset = offset
    page.length = len(raw)
    return page


class PageCache:
    """Parsed pages, least recently used evicted beyond ``budget_bytes``.

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


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        raise ValueError(f"attribute key must be {KEY_BYTES} bytes, got {key!r}")


class _Writer:
    """Lays a batch's pages out from ``start`` on, in the order they are finished."""

    def __init__(self, start: int) -> None:
        self.cursor = start
        self.parts: list[bytes] = []
        self.pages: list[_Page] = []

    def emit(self, page: _Page) -> bytes:
        """Write ``page``; returns its index entry for the parent."""
        raw = page.encode()
        page.offset = self.cursor
        page.length = len(raw)
        if page.offset > _U48_MAX:
            raise ValueError("attribute segment past 2**48 bytes")
        self.cursor += len(raw)
        self.parts.append(raw)
        self.pages.append(page)
        return _index_entry(page.keys[0], page.offset, page.length, page.subtree_min())


class BTree:
    """An append-only B+tree of 16-byte keys to int64 values (seed 003)."""

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
        self._state = state
        self._read = read
        self._cache = cache if cache is not None else PageCache(16 * 1024 * 1024)
        self._owner = owner
        self.compaction = compaction
        self._leaf_cap = (max_page - HEADER_BYTES) // LEAF_ENTRY
        self._index_cap = (max_page - HEADER_BYTES) // INDEX_ENTRY
        #: Pages read from storage by this tree object (cache misses).
        self.pages_read = 0
        self._writer = _Writer(state.length)
        self._changed = 0

    @property
    def state(self) -> TreeState:
        """Where the tree is now."""
        return self._state

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
        """The values of those ``keys`` the tree holds."""
        out: dict[bytes, int] = {}
        root = self._root()
        if root is None:
            return out
        for key in sorted(set(keys)):
            _check_key(key)
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
        low = self._state.start
        while page.offset != low and page.kind == INDEX:
            for i in range(len(page.keys)):
                offset, length, child_low = page.child(i)
                if child_low == low:
                    path.append(i)
                    page = self._load(offset, length)
                    break
            else:
                raise IndexCorrupt(
                    f"page at {page.offset}: no child holds the lowest offset {low} "
                    "its parent records"
                )
        return path

    def prepare(self, changes: Mapping[bytes, int | None]) -> Batch:
        """The batch that applies ``changes`` (None: remove the key); the tree is unchanged."""
        items = sorted(changes.items())
        for key, value in items:
            _check_key(key)
            if value is not None and not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"value {value} is not a signed 64-bit integer")
        state = self._state
        if not items:
            return Batch(b"", (), state, 0)
        writer = self._writer = _Writer(state.length)
        self._changed = 0
        self._replaced: list[int] = []
        root = self._root()
        if root is None:
            base = _Page(LEAF, [], bytearray())
            pages = self._apply(base, items, None)
        else:
            force = self._lowest_path(root) if self.compaction else None
            pages = self._apply(root, items, force)
            self._replaced.append(root.offset)
        if not pages:
            # Every key went: the empty tree (nothing live, all of it truncatable).
            end = writer.cursor
            new = TreeState(0, 0, end, end)
            return Batch(
                b"".join(writer.parts),
                _layout(writer),
                new,
                self._changed,
                tuple(writer.pages),
                tuple(self._replaced),
            )
        entries = [writer.emit(p) for p in pages]
        while len(entries) > 1:
            # The root split: new index levels above, split again if too wide.
            level = []
            for group in _even_groups(entries, self._index_cap):
                page = _Page(INDEX, [e[:KEY_BYTES] for e in group], bytearray(b"".join(group)))
                level.append(writer.emit(page))
            entries = level
        top = writer.pages[-1]
        # An index root with one child gives way to it (repeatedly).
        root_offset, root_length = top.offset, top.length
        dead = set(self._replaced)
        while top.kind == INDEX and len(top.keys) == 1:
            # Written in this batch, but dead at once.
            dead.add(top.offset)
            root_offset, root_length, _ = top.child(0)
            nxt = next((p for p in writer.pages if p.offset == root_offset), None)
            if nxt is None:
                break
            top = nxt
        low = self._subtree_low(root_offset, root_length, writer)
        new = TreeState(root_offset, root_length, writer.cursor, low)
        return Batch(
            b"".join(writer.parts),
            _layout(writer),
            new,
            self._changed,
            tuple(writer.pages),
            tuple(sorted(dead)),
        )

    def _subtree_low(self, offset: int, length: int, writer: _Writer) -> int:
        for p in writer.pages:
            if p.offset == offset:
                return p.subtree_min()
        return self._load(offset, length).subtree_min()

    def _apply(
        self, page: _Page, items: list[tuple[bytes, int | None]], force: list[int] | None
    ) -> list[_Page]:
        """The pages (not yet written) that replace ``page`` after ``items``.

        ``force``: the path (child indexes) below this page to the page
        progressive compaction re-appends ([] = this page), or None.
        """
        if page.kind == LEAF:
            new = page.copy()
            keys, data = new.keys, new.data
            for key, value in items:
                i = bisect.bisect_left(keys, key)
                found = i < len(keys) and keys[i] == key
                p = i * LEAF_ENTRY
                if value is None:
                    if found:
                        del keys[i]
                        del data[p : p + LEAF_ENTRY]
                        self._changed += 1
                elif found:
                    _VALUE.pack_into(data, p + KEY_BYTES, value)
                    self._changed += 1
                else:
                    keys.insert(i, key)
                    data[p:p] = key + _VALUE.pack(value)
                    self._changed += 1
            if not keys:
                return []
            return self._split(new, self._leaf_cap)
        # Index page: hand each child its items; rewrite the children touched.
        groups: dict[int, list[tuple[bytes, int | None]]] = {}
        for item in items:
            groups.setdefault(page.route(item[0]), []).append(item)
        forced_child = force[0] if force else None
        if forced_child is not None and forced_child not in groups:
            groups[forced_child] = []
        if not groups and force is None:
            return [page]
        writer = self._writer
        new_keys: list[bytes] = []
        new_data = bytearray()
        for i in range(len(page.keys)):
            if i not in groups:
                new_keys.append(page.keys[i])
                new_data += page.data[i * INDEX_ENTRY : (i + 1) * INDEX_ENTRY]
                continue
            offset, length, _ = page.child(i)
            child = self._load(offset, length)
            sub_force = force[1:] if force and i == forced_child else None
            replaced = self._apply(child, groups[i], sub_force)
            self._replaced.append(offset)
            for rp in replaced:
                entry = writer.emit(rp)
                new_keys.append(entry[:KEY_BYTES])
                new_data += entry
        if not new_keys:
            return []
        new = _Page(INDEX, new_keys, new_data)
        return self._split(new, self._index_cap)

    def _split(self, page: _Page, cap: int) -> list[_Page]:
        """``page`` as the fewest pages of at most ``cap`` entries, spread evenly."""
        n = len(page.keys)
        if n <= cap:
            return [page]
        size = page.entry
        out = []
        for lo, hi in _even_bounds(n, cap):
            out.append(
                _Page(page.kind, page.keys[lo:hi], bytearray(page.data[lo * size : hi * size]))
            )
        return out

    def commit(self, batch: Batch) -> None:
        """Adopt the batch's state (the caller stored ``batch.data``); cache its pages."""
        if batch.parsed:
            for page in batch.parsed:
                self._cache.put(self._owner, page)
        else:
            for offset, length in batch.pages:
                rel = offset - self._state.length
                self._cache.put(self._owner, parse_page(batch.data[rel : rel + length], offset))
        self._state = batch.state

    # -- fsck ---------------------------------------------------------------------------

    def verify(self) -> list[str]:
        """Every problem of the live tree, as text naming page offsets ([] when healthy)."""
        s = self._state
        problems: list[str] = []
        if not s.root_length:
            if s.start > s.length:
                problems.append(f"truncation offset {s.start} is past the end {s.length}")
            return problems

        def walk(offset: int, length: int, lo: bytes | None, hi: bytes | None) -> int | None:
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
                raw = self._read(offset, length)
                page = parse_page(bytes(raw), offset)
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
            low = offset
            if page.kind == INDEX:
                for i in range(len(keys)):
                    c_off, c_len, c_low = page.child(i)
                    c_lo = keys[i] if i else lo
                    c_hi = keys[i + 1] if i + 1 < len(keys) else hi
                    got = walk(c_off, c_len, c_lo, c_hi)
                    if got is not None and got != c_low:
                        problems.append(
                            f"page at {offset}: entry {i} records lowest offset {c_low}, "
                            f"its subtree's is {got}"
                        )
                    low = min(low, c_low if got is None else got)
            return low

        low = walk(s.root_offset, s.root_length, None, None)
        if low is not None and low < s.start:
            problems.append(f"a live page at {low} lies below the truncation offset {s.start}")
        return problems


def _even_bounds(n: int, cap: int) -> list[tuple[int, int]]:
    parts = -(-n // cap)
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]


def _even_groups(entries: list[bytes], cap: int) -> list[list[bytes]]:
    return [entries[lo:hi] for lo, hi in _even_bounds(len(entries), cap)]


def _layout(writer: _Writer) -> tuple[tuple[int, int], ...]:
    return tuple((p.offset, p.length) for p in writer.pages)
