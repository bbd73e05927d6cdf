"""One parse of the chunks a segment record names (GC, fsck, cold segments)."""

from __future__ import annotations

import pytest

from gateway.container.segment import Segment, chunks_of, record_chunks
from gateway.protocol.metadata_pb2 import AttributeIndexRecord, ChunkRecord, SegmentRecord
from gateway.tier2.housekeeping import _chunk_names

pytestmark = pytest.mark.timeout(10)


def record(n: int) -> SegmentRecord:
    return SegmentRecord(
        id=n,
        name=f"s{n}",
        length=20,
        storage_length=20,
        sealed=True,
        sealed_in_storage=True,
        chunks=[
            ChunkRecord(name=f"data-{n}-a", start_offset=0, length=10),
            ChunkRecord(name=f"data-{n}-b", start_offset=10, length=10),
        ],
        attribute_index=AttributeIndexRecord(
            chunks=[ChunkRecord(name=f"index-{n}", start_offset=0, length=4096)]
        ),
    )


def test_record_chunks_names_data_and_index_chunks_of_a_record_or_its_bytes() -> None:
    r = record(1)
    want = ["data-1-a", "data-1-b", "index-1"]
    assert [c.name for c in record_chunks(r)] == want
    assert [c.name for c in record_chunks(r.SerializeToString())] == want
    cold = Segment.cold_from_record(r, r.SerializeToString())
    assert [c.name for c in chunks_of(cold)] == want and cold.cold
    assert record_chunks(SegmentRecord(id=2, name="empty")) == []


def test_gc_names_every_chunk_of_the_cold_records() -> None:
    records = [record(n).SerializeToString() for n in range(3)]
    assert _chunk_names(records) == {
        name for n in range(3) for name in (f"data-{n}-a", f"data-{n}-b", f"index-{n}")
    }
