"""Message framing and the zero-copy split of large append requests."""

from __future__ import annotations

import pathlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client.client import open_client
from gateway.container import AttributeUpdate, Verb
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import encode_append_request, split_append_request

from .helpers.inprocess import served
from .helpers.segments import journal_segments, make_config

appends = st.builds(
    wire.AppendRequest,
    segment=st.text(max_size=20),
    writer_id=st.binary(max_size=16),
    event_number=st.integers(0, 2**62),
    previous_event_number=st.integers(0, 2**62),
    event_count=st.integers(0, 2**32 - 1),
    attribute_updates=st.lists(
        st.builds(wire.AttributeUpdate, id=st.binary(max_size=16), value=st.integers(-5, 5)),
        max_size=3,
    ),
)


@settings(max_examples=200, deadline=None)
@given(rid=st.integers(0, 2**64 - 1), a=appends, data=st.binary(max_size=2000),
       offset=st.none() | st.integers(0, 2**63))  # fmt: skip
def test_split_agrees_with_protobuf(
    rid: int, a: wire.AppendRequest, data: bytes, offset: int | None
) -> None:
    if offset is not None:
        a.expected_offset = offset
    full = wire.Request(request_id=rid, append=a)
    full.append.data = data
    for raw in (b"".join(encode_append_request(rid, a, data)), full.SerializeToString()):
        assert wire.Request.FromString(raw) == full
        split = split_append_request(raw)
        if not data:
            assert split is None  # no data field at all: the normal path handles it
            continue
        assert split is not None
        got_rid, head, view = split
        assert got_rid == rid and bytes(view) == data
        head.data = data
        assert head == full.append


def test_split_refuses_other_shapes() -> None:
    assert split_append_request(b"") is None
    assert split_append_request(b"\xff\xff") is None
    info = wire.Request(request_id=1, get_info=wire.GetInfoRequest(segment="x"))
    assert split_append_request(info.SerializeToString()) is None
    # The append not being the last field of the request.
    a = wire.Request(append=wire.AppendRequest(segment="s", data=b"xyz")).SerializeToString()
    assert split_append_request(a + b"\x08\x05") is None


async def test_large_appends_around_the_split_threshold(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path)
    sizes = [1, 64 * 1024 - 100, 64 * 1024, 64 * 1024 + 1, 200_000, 512 * 1024]
    expected = b""
    async with served(config) as s, open_client(s.address) as c:
        await c.create("big")
        for i, n in enumerate(sizes):
            data = bytes([i + 1]) * n
            r = await c.append(
                "big",
                data,
                expected_offset=len(expected),
                attribute_updates=[AttributeUpdate(b"A" * 16, Verb.ACCUMULATE, n)],
                writer_id=b"W" * 16,
                event_number=i + 1,
                previous_event_number=i,
            )
            assert (r.offset, r.length) == (len(expected), len(expected) + n)
            expected += data
        attrs = await c.get_attributes("big", [b"A" * 16, b"W" * 16])
        assert attrs == {b"A" * 16: sum(sizes), b"W" * 16: len(sizes)}
    assert journal_segments(config.journal_dir)["big"] == expected
