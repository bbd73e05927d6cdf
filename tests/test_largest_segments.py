"""`LargestSegments`: the status page's ranking of the longest segments, kept as
lengths change, against a brute-force ranking; and in a real table of cold
segments, recounted without warming one."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.container.largest import LargestSegments, committed_length
from gateway.container.segment import Segment
from tests.helpers import bulk
from tests.test_cold_segments import installed

# An operation: ("grow", id, bytes), ("delete", id), ("recount", slice size).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("grow"), st.integers(1, 10), st.integers(1, 1000)),
        st.tuples(st.just("delete"), st.integers(1, 10)),
        st.tuples(st.just("recount"), st.integers(1, 4)),
    ),
    max_size=300,
)


def _segment(seg_id: int, length: int) -> Segment:
    seg = Segment(seg_id, f"s/{seg_id}", 0)
    seg.durable = True
    seg.length = length
    return seg


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 3), st.integers(1, 3))
# The corners of the bound: one turned away, then a member deleted and a
# shorter one taken in; one left out of a recount's reading, then the
# member deleted; one read short by a recount that grew meanwhile.
@example([("grow", 1, 10), ("grow", 2, 9), ("grow", 3, 5), ("delete", 2), ("grow", 4, 3)], 2, 2)
@example([("grow", 1, 10), ("grow", 2, 8), ("recount", 1), ("delete", 1)], 1, 1)
@example([("grow", 1, 10), ("grow", 2, 9), ("grow", 3, 1), ("recount", 1), ("delete", 2),
          ("grow", 4, 2)], 2, 2)  # fmt: skip
@example([("grow", 1, 8), ("grow", 2, 10), ("delete", 2), ("recount", 1), ("delete", 1)], 1, 1)
@example([("grow", 1, 10), ("grow", 2, 8), ("recount", 1), ("delete", 1), ("grow", 5, 4)], 1, 1)
@example([("grow", 1, 8), ("grow", 2, 9), ("grow", 3, 20), ("grow", 4, 30), ("delete", 3),
          ("delete", 4), ("recount", 1), ("delete", 1), ("delete", 2)], 2, 2)  # fmt: skip
def test_the_ranking_is_the_brute_force_one_whenever_it_says_it_is_exact(
    ops: list[tuple], n: int, keep: int
) -> None:
    n = min(n, keep)  # it ranks at most what it keeps
    tracker = LargestSegments(keep=keep)
    live: dict[int, Segment] = {}
    for op in ops:
        if op[0] == "grow":
            seg = live.setdefault(op[1], _segment(op[1], 0))
            seg.length += op[2]
            tracker.grew(seg.id, seg.length)
        elif op[0] == "delete":
            if live.pop(op[1], None) is not None:
                tracker.removed(op[1])
        else:
            # A recount fed in slices, with the lengths changing between them.
            recount = tracker.begin_recount()
            segs = list(live.values())
            for i in range(0, len(segs), op[1]):
                recount.feed(segs[i : i + op[1]])
                if i == 0:  # one read grows, and one the pass does not see
                    segs[0].length += 7
                    tracker.grew(segs[0].id, segs[0].length)
                    new = live.setdefault(100 + len(live), _segment(100 + len(live), 0))
                    new.length += 3
                    tracker.grew(new.id, new.length)
            recount.finish(live.get)
            ranked, exact = tracker.top(n)
            assert exact
        ranked, exact = tracker.top(n)
        truth = sorted((s.length for s in live.values()), reverse=True)[:n]
        for seg_id, length in ranked:
            assert live[seg_id].length == length  # members' lengths are always exact
        if exact:
            assert [length for _, length in ranked] == truth[: len(ranked)]
            assert (
                len(ranked) == n
                or all(x == 0 for x in truth[len(ranked) :])
                or (len(ranked) == len(truth))
            )


@pytest.mark.timeout(60)
async def test_a_table_of_cold_segments_ranks_from_its_checkpoint_and_recounts_cold() -> None:
    c, _ = installed(300, active=30)
    table = c._table
    segs = list(table.by_id.values())
    assert sum(s.cold for s in segs) == 270
    # Loaded from the checkpoint: every segment is as long as the bulk chunk.
    ranked, exact = table.largest.top(5)
    assert exact and [length for _, length in ranked] == [len(bulk.CHUNK)] * 5

    # An active segment grows past the rest: first, by appends through the table.
    active = next(s for s in segs if not s.cold and not s.sealed)
    await c.append(active.name, b"z" * 1999 + b"\n")
    ranked, exact = table.largest.top(3)
    assert exact and ranked[0] == (active.id, 2000)

    # Deleting more than the tracker keeps leaves it unsure; a recount reads
    # the cold records and warms none.
    table.largest.keep = 20
    table.largest.members = dict(list(table.largest.members.items())[:20])
    table.largest.bound = len(bulk.CHUNK)
    for seg_id in list(table.largest.members)[:18]:
        await c.delete(table.by_id[seg_id].name)
    assert not table.largest.top(5)[1]
    cold_before = sum(s.cold for s in table.by_id.values())
    recount = table.largest.begin_recount()
    recount.feed(c.segments())
    recount.finish(c.segment_by_id)
    assert sum(s.cold for s in table.by_id.values()) == cold_before
    ranked, exact = table.largest.top(5)
    truth = sorted((committed_length(s) for s in c.segments()), reverse=True)[:5]
    assert exact and [length for _, length in ranked] == truth
    assert truth[1:] == [len(bulk.CHUNK)] * 4
    assert all(seg_id in table.by_id for seg_id, _ in ranked)


@pytest.mark.timeout(60)
async def test_the_page_asks_for_a_recount_when_unsure_and_the_run_makes_it_exact() -> None:
    """`StatusPage`'s ranking and its background recount, on a real container (the
    collector's only part they read)."""
    import types

    import trio
    import trio.testing

    from gateway import status

    c, _ = installed(3000, active=0)
    table = c._table
    page = status.StatusPage(types.SimpleNamespace(node=types.SimpleNamespace(container=c)))  # type: ignore[arg-type]
    html, exact = page._largest()
    assert exact and html.count("<tr>") == status.TOP + 1  # header and TOP rows
    assert "sealed, in Tier 2 (cold)" in html
    for seg_id in list(table.largest.members)[: table.largest.keep - 5]:
        await c.delete(table.by_id[seg_id].name)
    html, exact = page._largest()
    assert not exact and html.count("<tr>") == 6
    cold = sum(s.cold for s in table.by_id.values())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(page.run)  # it was asked for above
        # Blocked once the recount is done and the run waits out RECOUNT_INTERVAL.
        await trio.testing.wait_all_tasks_blocked()
        assert table.largest.recounts == 1
        nursery.cancel_scope.cancel()
    html, exact = page._largest()
    assert exact and html.count("<tr>") == status.TOP + 1
    assert sum(s.cold for s in table.by_id.values()) == cold  # none warmed
