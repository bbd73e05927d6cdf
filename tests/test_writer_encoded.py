"""`SegmentWriter.write_encoded`: blocks of already encoded events, exactly once."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import AsyncIterator

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.writer import open_segment_writer

from .helpers.inprocess import Served, served
from .helpers.proxy import DroppingProxy
from .helpers.segments import make_config

KiB = 1024
MAX_APPEND = 512 * KiB  # make_config's container.max_append_bytes


def frame(event: bytes) -> bytes:
    return struct.pack(">I", len(event)) + event


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[Served]:
    async with served(make_config(tmp_path)) as s:
        yield s


async def test_a_block_gets_the_next_event_numbers_between_single_events(server: Served) -> None:
    async with open_client(server.address) as c:
        await c.create("w/lines", codec="lines")
    async with open_segment_writer(server.address, "w/lines", codec="lines") as w:
        assert w.max_append_bytes == MAX_APPEND
        await w.write(b"one")
        assert await w.write_encoded(b"two\nthree\n") == 2
        assert w.next_event_number == 4
        await w.write(b"four")
        assert await w.write_encoded(b"five\n", 1) == 1
        await w.write_encoded(b"\n")  # an empty event
        await w.flush()
        assert w.acked_event == 6
        # The buffered event goes first, then each block as one append.
        assert w.statistics()["appends"] == 5
    async with open_client(server.address) as c:
        info = await c.info("w/lines")
        assert (await c.read("w/lines", 0, 1 << 20)).data == b"one\ntwo\nthree\nfour\nfive\n\n"
        assert info.event_count == 6
        assert (await c.get_attributes("w/lines", [w.writer_id]))[w.writer_id] == 6

    # The same writer id continues after the last stored number.
    async with open_segment_writer(
        server.address, "w/lines", codec="lines", writer_id=w.writer_id
    ) as again:
        assert again.next_event_number == 7
        assert await again.write_encoded(b"six\nseven\n") == 2
    async with open_client(server.address) as c:
        assert (await c.get_attributes("w/lines", [w.writer_id]))[w.writer_id] == 8
        assert (await c.info("w/lines")).event_count == 8


async def test_framed_and_raw_blocks(server: Served) -> None:
    async with open_client(server.address) as c:
        await c.create("w/framed", codec="framed")
        await c.create("w/raw")
    block = frame(b"ab") + frame(b"") + frame(b"cde")
    async with open_segment_writer(server.address, "w/framed", codec="framed") as w:
        assert await w.write_encoded(block) == 3
        await w.write(b"fg")
    async with open_segment_writer(server.address, "w/raw") as r:
        assert await r.write_encoded(b"xyz") == 1  # raw: one event unless told
        assert await r.write_encoded(b"0123456789", 10) == 10
    async with open_client(server.address) as c:
        assert (await c.read("w/framed", 0, 1 << 20)).data == block + frame(b"fg")
        assert (await c.info("w/framed")).event_count == 4
        assert (await c.read("w/raw", 0, 1 << 20)).data == b"xyz0123456789"
        assert (await c.info("w/raw")).event_count == 11
        assert (await c.get_attributes("w/raw", [r.writer_id]))[r.writer_id] == 11


async def test_a_block_that_is_not_whole_events_is_refused_with_nothing_queued(
    server: Served,
) -> None:
    async with open_client(server.address) as c:
        await c.create("w/refused", codec="lines")
        await c.create("w/refused-framed", codec="framed")
        await c.create("w/raw-refused")
    async with open_segment_writer(server.address, "w/refused", codec="lines") as w:
        with pytest.raises(ValueError, match="end with a newline"):
            await w.write_encoded(b"a\nb")  # "b" is not a whole event
        with pytest.raises(ValueError, match="end with a newline"):
            await w.write_encoded(b"")
        with pytest.raises(ValueError, match="holds 2 lines event"):
            await w.write_encoded(b"a\nb\n", 3)
        with pytest.raises(ValueError, match="largest append"):
            await w.write_encoded(b"x" * MAX_APPEND + b"\n")
        assert w.next_event_number == 1
        await w.write_encoded(b"x" * (MAX_APPEND - 1) + b"\n")  # at the limit: taken
        assert w.next_event_number == 2
    async with open_segment_writer(server.address, "w/refused-framed", codec="framed") as f:
        with pytest.raises(ValueError, match="needs 2 more byte"):
            await f.write_encoded(frame(b"ok") + struct.pack(">I", 5) + b"abc")
        with pytest.raises(ValueError, match="not a whole 4-byte length"):
            await f.write_encoded(frame(b"ok") + b"\x00\x00")
        with pytest.raises(ValueError, match="empty"):
            await f.write_encoded(b"")
        with pytest.raises(ValueError, match="holds 1 framed"):
            await f.write_encoded(frame(b"ok"), 2)
        assert f.next_event_number == 1
    async with open_segment_writer(server.address, "w/raw-refused") as r:
        with pytest.raises(ValueError, match="at least one event"):
            await r.write_encoded(b"abc", 0)
    async with open_client(server.address) as c:
        assert (await c.read("w/refused", 0, 1 << 20)).data == b"x" * (MAX_APPEND - 1) + b"\n"
        assert (await c.info("w/refused")).event_count == 1
        assert (await c.info("w/refused-framed")).length == 0


@pytest.mark.timeout(60)
async def test_blocks_land_exactly_once_across_dropped_connections(server: Served) -> None:
    async with open_client(server.address) as c:
        await c.create("w/eo", codec="lines")
    proxy = DroppingProxy(int(server.address.rsplit(":", 1)[1]))
    expected: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_segment_writer(
            f"127.0.0.1:{proxy.port}", "w/eo", codec="lines", max_inflight_bytes=64 * KiB
        ) as w:
            for k in range(60):
                lines = [b"b%03d-e%03d" % (k, i) for i in range(k % 7 + 1)]
                expected += lines
                await w.write_encoded(b"".join(line + b"\n" for line in lines))
                if k % 10 == 9:
                    # Cut with blocks in flight: unacknowledged ones are resent,
                    # stored ones are not; the flush waits for the reconnection.
                    proxy.drop_all()
                    await w.flush()
        nursery.cancel_scope.cancel()
    assert w.reconnects >= 6
    async with open_client(server.address) as c:
        data = (await c.read("w/eo", 0, 1 << 20)).data
        assert data.split(b"\n")[:-1] == expected
        assert (await c.info("w/eo")).event_count == len(expected)
        assert (await c.get_attributes("w/eo", [w.writer_id]))[w.writer_id] == len(expected)
