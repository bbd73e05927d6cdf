"""Frame encoding and decoding, without files or a writer."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.journal.format import (
    HEADER_SIZE,
    FrameError,
    decode_header,
    encode_append,
    encode_attribute_values,
    encode_group,
    encode_header,
    frame_crc_ok,
    last_part_offsets,
    operation_ends,
    operation_prefix,
)
from gateway.journal.reader import FileEnd, FrameRecord, read_frames
from gateway.protocol.journal_pb2 import Append, Frame, Operation
from gateway.protocol.metadata_pb2 import AttributeValue

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    segment_id=U64,
    offset=U64,
    data=st.binary(max_size=300),
    attrs=st.dictionaries(st.binary(min_size=16, max_size=16), st.integers(-(2**63), 2**63 - 1)),
    at_ms=st.integers(min_value=0, max_value=2**62),
)
def test_encode_append_matches_protobuf(
    segment_id: int, offset: int, data: bytes, attrs: dict[bytes, int], at_ms: int
) -> None:
    head, body = encode_append(segment_id, offset, data, encode_attribute_values(attrs, 3), at_ms)
    assert body is data
    expected = Operation(
        append=Append(
            segment_id=segment_id,
            offset=offset,
            data=data,
            at_ms=at_ms,
            attributes=[AttributeValue(id=k, value=v) for k, v in attrs.items()],
        )
    )
    assert head + body == expected.SerializeToString()


def test_encode_append_large_length_varint() -> None:
    data = bytes(200_000)
    head, body = encode_append(3, 2**40, data)
    op = Operation.FromString(head + body)
    assert op.append.segment_id == 3
    assert op.append.offset == 2**40
    assert op.append.data == data


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=20))
def test_operation_prefix_builds_a_frame(ops: list[bytes]) -> None:
    payload = b"".join(operation_prefix(len(o)) + o for o in ops)
    ops_msgs = [
        Operation(append=Append(segment_id=1, offset=i, data=o)).SerializeToString()
        for i, o in enumerate(ops)
    ]
    payload = b"".join(operation_prefix(len(o)) + o for o in ops_msgs)
    frame = Frame.FromString(payload)
    assert [op.append.data for op in frame.operations] == ops


def _group(ops: list[bytes]) -> tuple[list[bytes], list[int], list[int]]:
    parts: list[bytes] = []
    ends: list[int] = []
    sizes: list[int] = []
    for o in ops:
        prefix = operation_prefix(len(o))
        parts += [prefix, o]
        ends.append(len(parts))
        sizes.append(len(prefix) + len(o))
    return parts, ends, sizes


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=70_000), min_size=1, max_size=25),
    max_frame=st.integers(min_value=64, max_value=100_000),
)
def test_append_data_lies_where_last_part_offsets_says(sizes: list[int], max_frame: int) -> None:
    """The read index preads unflushed data from where the journal says it wrote it."""
    parts: list[bytes] = []
    ends: list[int] = []
    lengths: list[int] = []
    datas = [bytes([i % 251 + 1]) * n for i, n in enumerate(sizes)]
    for i, data in enumerate(datas):
        head, body = encode_append(9, i, data)
        prefix = operation_prefix(len(head) + len(body))
        parts += [prefix, head, body]
        ends.append(len(parts))
        lengths.append(len(prefix) + len(head) + len(body))
    buffers, _, _ = encode_group(parts, ends, lengths, 1, 1, max_frame)
    written = b"".join(buffers)
    offsets = last_part_offsets(parts, ends, lengths, max_frame)
    assert len(offsets) == len(datas)
    for at, data in zip(offsets, datas, strict=True):
        assert written[at : at + len(data)] == data
    # Replay finds the same places from the frames alone.
    found: list[int] = []
    for r in read_frames(written, pathlib.Path("mem")):
        if isinstance(r, FrameRecord):
            op_ends = operation_ends(r.payload)
            assert op_ends is not None and len(op_ends) == r.header.operation_count
            for end, op in zip(op_ends, r.operations(), strict=True):
                found.append(r.offset + HEADER_SIZE + end - len(op.append.data))
    assert found == offsets


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=70_000), min_size=1, max_size=25),
    max_frame=st.integers(min_value=64, max_value=100_000),
    first=st.integers(min_value=1, max_value=2**50),
    epoch=st.integers(min_value=1, max_value=2**32),
)
def test_group_round_trip(sizes: list[int], max_frame: int, first: int, epoch: int) -> None:
    ops = [
        Operation(append=Append(segment_id=7, offset=i, data=bytes([i % 251]) * n))
        for i, n in enumerate(sizes)
    ]
    serialized = [o.SerializeToString() for o in ops]
    buffers, total, frames = encode_group(*_group(serialized), first, epoch, max_frame)
    data = b"".join(buffers)
    assert len(data) == total

    records = list(read_frames(data, pathlib.Path("mem")))
    assert isinstance(records[-1], FileEnd) and records[-1].reason is None
    frame_records = [r for r in records if isinstance(r, FrameRecord)]
    assert len(frame_records) == frames
    decoded: list[Operation] = []
    seq = first
    for r in frame_records:
        h = r.header
        assert h.first_sequence == seq
        assert h.group_sequence == first
        assert h.epoch == epoch
        # A frame exceeds the limit only when it holds one oversized operation.
        assert h.payload_length <= max_frame or h.operation_count == 1
        ops_in_frame = r.operations()
        decoded += ops_in_frame
        seq += h.operation_count
    assert decoded == ops


def test_header_checks() -> None:
    payload = b"hello"
    header = encode_header([payload], len(payload), 1, 10, 10, 3)
    assert len(header) == HEADER_SIZE
    h = decode_header(header)
    assert (h.first_sequence, h.group_sequence, h.epoch, h.operation_count) == (10, 10, 3, 1)
    assert frame_crc_ok(header, payload)
    assert not frame_crc_ok(header, b"hellp")
    with pytest.raises(FrameError, match="zero-filled"):
        decode_header(bytes(HEADER_SIZE))
    with pytest.raises(FrameError, match="short header"):
        decode_header(header[:20])
    with pytest.raises(FrameError, match="bad magic"):
        decode_header(b"XXXX" + header[4:])
    with pytest.raises(FrameError, match="unsupported frame format version"):
        decode_header(header[:4] + b"\x09\x00" + header[6:])
    bad_group = encode_header([payload], len(payload), 1, 10, 11, 3)
    with pytest.raises(FrameError, match="impossible header"):
        decode_header(bad_group)


def test_crc_covers_header_fields() -> None:
    payload = b"x" * 100
    header = bytearray(encode_header([payload], len(payload), 1, 5, 5, 1))
    header[16] ^= 0x01  # first sequence number
    assert not frame_crc_ok(bytes(header), payload)
