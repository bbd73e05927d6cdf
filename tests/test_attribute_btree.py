"""The attribute index's B+tree alone (`gateway.attrindex.btree`), on a bytearray.

Pages are tiny here (a few hundred bytes) so that a few hundred keys make
trees of three and four levels. Head truncation is simulated by overwriting
everything below the tree's ``start`` with garbage: a read of a page there
fails its CRC.
"""

from __future__ import annotations

import random
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.attrindex.btree import (
    PAGE_SIZE,
    Batch,
    BTree,
    IndexCorrupt,
    PageCache,
    TreeState,
)


class Store:
    """An attribute segment in memory."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.start = 0

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.data[offset : offset + length])

    def truncate(self, start: int) -> None:
        if start > self.start:
            self.data[self.start : start] = b"\xee" * (start - self.start)
            self.start = start


def tree(store: Store, state: TreeState, max_page: int, compaction: bool, cache: bool) -> BTree:
    return BTree(
        state,
        store.read,
        cache=PageCache(1 << 20) if cache else PageCache(0),
        owner="t",
        compaction=compaction,
        max_page=max_page,
    )


def commit(t: BTree, store: Store, changes: dict[bytes, int | None]) -> None:
    batch = t.prepare(changes)
    assert len(store.data) == t.state.length
    store.data += batch.data
    # The pages the batch says it replaced are dead: garble them (a read of
    # a live one there would fail its CRC).
    sizes = dict(batch.pages)
    for offset in batch.replaced:
        n = sizes.get(offset) or 16
        store.data[offset : offset + n] = b"\xdd" * n
    t.commit(batch)
    store.truncate(t.state.start)


def check(t: BTree, model: dict[bytes, int], probe: list[bytes]) -> None:
    assert t.verify() == []
    assert t.count() == len(model)
    assert t.range() == sorted(model.items())
    assert t.get(probe) == {k: model[k] for k in probe if k in model}


KEYS = [bytes([i % 7]) + random.Random(i).randbytes(15) for i in range(300)]
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("batch"),
            st.lists(
                st.tuples(
                    st.sampled_from(KEYS),
                    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
                ),
                min_size=1,
                max_size=40,
            ),
        ),
        st.tuples(st.just("range"), st.sampled_from(KEYS), st.integers(0, 20)),
        st.tuples(st.just("restart"), st.booleans()),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.timeout(180)
@settings(max_examples=300, deadline=None)
@given(script=steps, max_page=st.sampled_from([112, 256, 512]), compaction=st.booleans())
def test_tree_matches_a_dict(
    script: list[tuple[object, ...]], max_page: int, compaction: bool
) -> None:
    store = Store()
    t = tree(store, TreeState(), max_page, compaction, cache=True)
    model: dict[bytes, int] = {}
    for step in script:
        if step[0] == "batch":
            changes = dict(step[1])  # type: ignore[arg-type]
            commit(t, store, changes)
            for k, v in changes.items():
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
            check(t, model, KEYS[:50])
        elif step[0] == "range":
            start, limit = step[1], step[2]
            want = sorted((k, v) for k, v in model.items() if k >= start)  # type: ignore[operator]
            assert t.range(start, limit) == (want[:limit] if limit else want)  # type: ignore[arg-type]
        else:
            # A restart: a fresh tree from the journaled state, cold or not.
            t = tree(store, t.state, max_page, compaction, cache=bool(step[1]))
            check(t, model, KEYS)


@pytest.mark.timeout(120)
def test_progressive_compaction_keeps_the_live_size_bounded() -> None:
    rng = random.Random(3)
    keys = sorted(rng.randbytes(16) for _ in range(2000))
    hot = keys[1000:]  # the pages of the lower half are never updated
    sizes: dict[bool, list[int]] = {True: [], False: []}
    for compaction in (True, False):
        store = Store()
        t = tree(store, TreeState(), 512, compaction, cache=True)
        commit(t, store, dict.fromkeys(keys, 0))
        for _round in range(4):
            for _ in range(300):
                commit(t, store, {k: rng.randrange(1000) for k in rng.sample(hot, 10)})
            sizes[compaction].append(t.state.length - t.state.start)
        assert t.count() == len(keys)
        assert t.verify() == []
    # Without compaction the pages no update touches pin the head, so the
    # size after truncation grows with every batch (seed 003, Figure 4); with
    # it, they are re-appended a page per batch and the size stays put.
    with_, without = sizes[True], sizes[False]
    assert max(with_) < 1.5 * min(with_), with_
    assert without[-1] > 1.5 * without[0] and without[-1] > 2 * with_[-1], (with_, without)


@pytest.mark.timeout(60)
def test_an_uncommitted_batch_changes_nothing() -> None:
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=False)
    commit(t, store, {k: i for i, k in enumerate(KEYS[:100])})
    before = t.state
    # The batch is stored (uploaded) but never journaled: the crash case.
    batch = t.prepare({k: None for k in KEYS[:60]} | {KEYS[200]: 7})
    store.data += batch.data
    assert t.state == before
    again = tree(store, before, 256, True, cache=False)
    check(again, {k: i for i, k in enumerate(KEYS[:100])}, KEYS[:210])
    # The next batch is written after the orphan and does not depend on it.
    store.data = store.data[: before.length]
    commit(again, store, {KEYS[201]: 1})
    assert again.get([KEYS[201], KEYS[0]]) == {KEYS[201]: 1, KEYS[0]: 0}


@pytest.mark.timeout(60)
def test_a_damaged_page_is_reported_by_offset() -> None:
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=False)
    commit(t, store, {k: 1 for k in KEYS[:100]})
    root = t.state.root_offset
    store.data[root + 20] ^= 0xFF
    with pytest.raises(IndexCorrupt, match=f"page at {root}"):
        t.get([KEYS[0]])
    problems = t.verify()
    assert problems and str(root) in problems[0]


@pytest.mark.timeout(60)
def test_bad_input_changes_nothing() -> None:
    store = Store()
    t = tree(store, TreeState(), PAGE_SIZE, True, cache=True)
    commit(t, store, {KEYS[0]: 1})
    before = (t.state, bytes(store.data))
    for bad_key in (b"short", KEYS[1][:15], KEYS[1] + b"x", "a" * 16):
        with pytest.raises(ValueError, match="16 bytes"):
            t.prepare({KEYS[2]: 1, bad_key: 1})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="16 bytes"):
            t.get([bad_key])  # type: ignore[list-item]
    for bad_value in (2**63, -(2**63) - 1, 1.5, "1"):
        with pytest.raises(ValueError, match="64-bit"):
            t.prepare({KEYS[2]: 1, KEYS[1]: bad_value})  # type: ignore[dict-item]
    assert (t.state, bytes(store.data)) == before
    assert t.get([KEYS[0], KEYS[2]]) == {KEYS[0]: 1}
    empty = t.prepare({})
    assert (empty.data, empty.pages, empty.state, empty.changed) == (b"", (), before[0], 0)
    # The extremes of int64 are values like any other.
    commit(t, store, {KEYS[1]: 2**63 - 1, KEYS[2]: -(2**63)})
    assert t.get(KEYS[:3]) == {KEYS[0]: 1, KEYS[1]: 2**63 - 1, KEYS[2]: -(2**63)}


@pytest.mark.timeout(60)
def test_removing_every_key_leaves_an_empty_truncatable_tree() -> None:
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=True)
    commit(t, store, {k: 1 for k in KEYS[:80]})
    commit(t, store, dict.fromkeys(KEYS[:80]))
    assert t.state.root_length == 0 and t.state.start == t.state.length
    assert t.range() == [] and t.get(KEYS[:5]) == {} and t.count() == 0
    commit(t, store, {KEYS[5]: 9})
    assert t.range() == [(KEYS[5], 9)]


@pytest.mark.timeout(60)
def test_removing_absent_keys_writes_nothing() -> None:
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=True)
    commit(t, store, {k: 1 for k in KEYS[:100]})
    batch = t.prepare(dict.fromkeys(KEYS[200:220]))
    assert (batch.data, batch.changed, batch.state) == (b"", 0, t.state)
    # Mixed with a real change, only the pages on the real change's path
    # (and compaction's) are written.
    one = t.prepare({KEYS[0]: 2})
    mixed = t.prepare({KEYS[0]: 2, **dict.fromkeys(KEYS[200:220])})
    assert mixed.changed == 1 and mixed.data == one.data and mixed.state == one.state


@pytest.mark.timeout(60)
def test_batches_lay_children_before_parents_and_name_the_state() -> None:
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=True)
    commit(t, store, {k: 1 for k in KEYS[:200]})
    before = t.state
    batch = t.prepare({KEYS[5]: 2, KEYS[150]: 3})
    offsets = [off for off, _ in batch.pages]
    assert offsets[0] == before.length and offsets == sorted(offsets)
    # Contiguous, and the root is the last page written.
    assert all(a + n == b for (a, n), (b, _) in zip(batch.pages, batch.pages[1:], strict=False))
    assert batch.pages[-1] == (batch.state.root_offset, batch.state.root_length)
    assert batch.state.length == before.length + len(batch.data)
    # A tree that commits a batch it did not prepare (a restart between the
    # two, say) parses its pages from the bytes.
    store.data += batch.data
    other = tree(store, before, 256, True, cache=True)
    other.commit(Batch(batch.data, batch.pages, batch.state, batch.changed))
    assert other.state == batch.state and other.pages_written() == len(batch.pages)
    assert other.get([KEYS[5], KEYS[150]]) == {KEYS[5]: 2, KEYS[150]: 3}
    assert other.verify() == []


@pytest.mark.timeout(60)
def test_compaction_follows_min_offsets_not_the_journaled_start() -> None:
    """A state whose ``start`` is below the tree's true lowest page still compacts."""
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=True)
    commit(t, store, {k: 1 for k in KEYS[:200]})
    for i in range(20):
        commit(t, store, {KEYS[i]: 5})
    s = t.state
    assert s.start > 0
    # The same tree journaled with a lower start: nothing is below it, so
    # it is sound; the next batch finds the lowest page from the root.
    stale = TreeState(s.root_offset, s.root_length, s.length, 0)
    again = tree(store, stale, 256, True, cache=True)
    assert again.verify() == []
    batch = again.prepare({KEYS[50]: 9})
    assert batch.state.start > s.start
    # ...and a state whose start is above a live page is reported.
    above = TreeState(s.root_offset, s.root_length, s.length, s.start + 1)
    wrong = tree(store, above, 256, True, cache=True)
    assert any(f"below the truncation offset {s.start + 1}" in p for p in wrong.verify())


@pytest.mark.timeout(60)
def test_verify_reports_a_wrong_min_offset() -> None:
    """An index entry whose min_offset lies (the page's CRC made right again) is found."""
    store = Store()
    t = tree(store, TreeState(), 256, True, cache=False)
    commit(t, store, {k: 1 for k in KEYS[:200]})
    root, n = t.state.root_offset, t.state.root_length
    page = bytearray(store.data[root : root + n])
    assert page[5] == 2  # an index page
    # Entry 0's min_offset (after its key, offset and length): one more than it is.
    at = 16 + 16 + 6 + 2
    (low,) = struct.unpack_from(">Q", page, at)
    struct.pack_into(">Q", page, at, low + 1)
    page[12:16] = bytes(4)
    page[12:16] = crc32c.crc32c(bytes(page)).to_bytes(4, "big")
    store.data[root : root + n] = page
    problems = t.verify()
    assert any(f"page at {root}: entry 0 records lowest offset {low + 1}" in p for p in problems)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("compaction", [True, False])
def test_a_root_with_one_child_gives_way_to_it(compaction: bool) -> None:
    store = Store()
    t = tree(store, TreeState(), 256, compaction, cache=False)
    keys = sorted(KEYS[:200])
    commit(t, store, dict.fromkeys(keys, 1))
    assert store.data[t.state.root_offset + 5] == 2  # kind: index
    # Every key but the lowest two, in two batches: one leaf is left.
    commit(t, store, dict.fromkeys(keys[100:]))
    commit(t, store, dict.fromkeys(keys[2:100]))
    assert store.data[t.state.root_offset + 5] == 1  # kind: leaf
    assert t.range() == [(keys[0], 1), (keys[1], 1)]
    assert t.verify() == []
    assert t.state.start == t.state.root_offset  # the leaf is the only live page
