"""The wire protocol against a live server: every error, ordering, bad input."""

from __future__ import annotations

import pathlib
import socket
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client.client import Client, open_client
from gateway.client.sync import SyncClient
from gateway.container import EVENT_COUNT, AttributeUpdate, Verb
from gateway.errors import (
    BadAttributeUpdate,
    BadOffset,
    BadRequest,
    ConditionalCheckFailed,
    ConnectionLost,
    GatewayError,
    InvalidName,
    LimitExceeded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    TooLarge,
    Unauthorized,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.encoding import varint

from .helpers.daemon import Daemon
from .helpers.inprocess import Served, served
from .helpers.segments import journal_segments, make_config

A1 = b"\x01" * 16


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[Served]:
    config = make_config(tmp_path, container={"max_segments": 50})
    async with served(config) as s:
        yield s


Step = Callable[[Client], Awaitable[Any]]


async def _setup(c: Client) -> None:
    await c.create("s")
    await c.append("s", b"abc", attribute_updates=[AttributeUpdate(A1, Verb.REPLACE, 5)])
    await c.append("s", b"d", writer_id=b"W" * 16, event_number=4, previous_event_number=0)
    await c.create("sealed")
    await c.seal("sealed")
    await c.create("framed", codec="framed")


def upd(verb: Verb, value: int, **kw: Any) -> list[AttributeUpdate]:
    return [AttributeUpdate(A1, verb, value, **kw)]


# (name, call, expected error class, check on the error)
CASES: list[tuple[str, Step, type[GatewayError], Callable[[Any], bool]]] = [
    ("create invalid name", lambda c: c.create("a//b"), InvalidName, lambda e: True),
    ("create existing", lambda c: c.create("s"), SegmentExists, lambda e: True),
    ("create with core attribute",
     lambda c: c.create("n", [AttributeUpdate(EVENT_COUNT, Verb.REPLACE, 1)]),
     BadAttributeUpdate, lambda e: True),
    ("append missing", lambda c: c.append("nope", b"x"), SegmentNotFound, lambda e: True),
    ("append invalid name", lambda c: c.append("../x", b"x"), InvalidName, lambda e: True),
    ("append sealed", lambda c: c.append("sealed", b"x"), SegmentSealed, lambda e: True),
    ("append bad offset", lambda c: c.append("s", b"x", expected_offset=1), BadOffset,
     lambda e: e.expected_offset == 4),
    ("append too large", lambda c: c.append("s", bytes(512 * 1024 + 1)), TooLarge,
     lambda e: True),
    ("append failing attribute", lambda c: c.append("s", b"x", attribute_updates=upd(
        Verb.REPLACE_IF_EQUALS, 1, compare_value=4)), ConditionalCheckFailed, lambda e: True),
    ("append duplicate writer", lambda c: c.append(
        "s", b"d", writer_id=b"W" * 16, event_number=4, previous_event_number=0),
     ConditionalCheckFailed, lambda e: e.last_event_number == 4),
    ("append short attribute id", lambda c: c.append("s", b"x", attribute_updates=[
        AttributeUpdate(b"abc", Verb.REPLACE, 1)]), BadAttributeUpdate, lambda e: True),
    ("append core attribute", lambda c: c.append("s", b"x", attribute_updates=[
        AttributeUpdate(EVENT_COUNT, Verb.REPLACE, 1)]), BadAttributeUpdate, lambda e: True),
    ("append unknown verb", lambda c: c.append("s", b"x", attribute_updates=[
        AttributeUpdate(A1, 7, 1)]), BadRequest, lambda e: True),  # type: ignore[arg-type]
    ("seal missing", lambda c: c.seal("nope"), SegmentNotFound, lambda e: True),
    ("seal sealed", lambda c: c.seal("sealed"), SegmentSealed, lambda e: True),
    ("truncate past length", lambda c: c.truncate("s", 5), BadOffset,
     lambda e: e.expected_offset == 4),
    ("truncate missing", lambda c: c.truncate("nope", 0), SegmentNotFound, lambda e: True),
    ("delete missing", lambda c: c.delete("nope"), SegmentNotFound, lambda e: True),
    ("update sealed", lambda c: c.update_attributes("sealed", upd(Verb.REPLACE, 1)),
     SegmentSealed, lambda e: True),
    ("update failing", lambda c: c.update_attributes("s", upd(Verb.REPLACE_IF_GREATER, 5)),
     ConditionalCheckFailed, lambda e: True),
    ("update missing", lambda c: c.update_attributes("nope", upd(Verb.REPLACE, 1)),
     SegmentNotFound, lambda e: True),
    ("update unknown verb", lambda c: c.update_attributes("s", [
        AttributeUpdate(A1, 7, 1)]), BadRequest, lambda e: True),  # type: ignore[arg-type]
    ("info missing", lambda c: c.info("nope"), SegmentNotFound, lambda e: True),
    ("info invalid", lambda c: c.info("a b"), InvalidName, lambda e: True),
    ("list invalid prefix", lambda c: c.list("a b"), InvalidName, lambda e: True),
    ("attributes missing", lambda c: c.get_attributes("nope"), SegmentNotFound, lambda e: True),
    ("attributes bad id", lambda c: c.get_attributes("s", [b"x"]), BadAttributeUpdate,
     lambda e: True),
    ("second hello", lambda c: c._hello("", "again"), BadRequest, lambda e: True),
    ("create unknown codec", lambda c: c._call(create=wire.CreateSegmentRequest(
        segment="c", codec=7)), BadRequest, lambda e: "codec" in str(e)),  # type: ignore[arg-type]
    ("create in the trimmed view", lambda c: c.create(".trimmed/x"), InvalidName,
     lambda e: "trimmed" in str(e)),
    ("append not whole frames", lambda c: c.append("framed", b"\0\0\0\x09abc"), BadRequest,
     lambda e: "not whole events" in str(e)),
    ("attribute range bad start", lambda c: c.attribute_range("s", b"short"), BadRequest,
     lambda e: "16 bytes" in str(e)),
    ("attribute range missing", lambda c: c.attribute_range("nope"), SegmentNotFound,
     lambda e: True),
    ("remove a core attribute", lambda c: c.update_attributes("s", [
        AttributeUpdate(EVENT_COUNT, Verb.REMOVE, 0)]), BadAttributeUpdate, lambda e: True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "error", "check"), CASES, ids=[c[0] for c in CASES])
async def test_error_cases(
    server: Served,
    name: str,
    call: Step,
    error: type[GatewayError],
    check: Callable[[Any], bool],
) -> None:
    async with open_client(server.address) as c:
        await _setup(c)
        before = await c.info("s")
        with pytest.raises(error) as info:
            await call(c)
        assert check(info.value), info.value
        assert str(info.value), "errors carry a message"
        # Nothing changed, and the connection still works.
        assert await c.info("s") == before


async def test_limit_on_segments(server: Served) -> None:
    async with open_client(server.address) as c:
        for i in range(50):
            await c.create(f"x{i}")
        with pytest.raises(LimitExceeded):
            await c.create("one-too-many")
        assert len(await c.list()) == 50


async def test_conditional_appends(server: Served) -> None:
    async with open_client(server.address) as c:
        await c.create("s")
        offset = 0
        for i in range(20):
            data = f"event-{i};".encode()
            r = await c.append("s", data, expected_offset=offset)
            assert r.offset == offset
            offset = r.length
            with pytest.raises(BadOffset) as bad:
                await c.append("s", b"stale", expected_offset=offset - 1)
            assert bad.value.expected_offset == offset
        await c.append("s", b"g", attribute_updates=upd(Verb.REPLACE_IF_EQUALS, 1,
                                                         expect_absent=True))  # fmt: skip
        assert (await c.get_attributes("s", [A1])) == {A1: 1}
    segs = journal_segments(server.container._journal.directory)  # type: ignore[union-attr]
    assert segs["s"] == b"".join(f"event-{i};".encode() for i in range(20)) + b"g"


# -- raw connections: ordering and connection-level errors ----------------------


class Raw:
    """A bare protocol connection for tests that need exact bytes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, req: wire.Request) -> None:
        data = req.SerializeToString()
        await self.stream.send_all(struct.pack(">I", len(data)) + data)

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> wire.Response | None:
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    msg, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    return wire.Response.FromString(msg)
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return None
            self.buf += chunk

    async def hello(self, token: str = "", version: int = 1) -> wire.Response | None:
        await self.send(wire.Request(request_id=1, hello=wire.Hello(protocol_version=version,
                                                                     token=token)))  # fmt: skip
        return await self.receive()


async def raw(address: str) -> Raw:
    host, port = address.rsplit(":", 1)
    return Raw(await trio.open_tcp_stream(host, int(port)))


async def test_pipelined_appends_with_seal_in_the_middle(server: Served) -> None:
    r = await raw(server.address)
    assert (await r.hello()).WhichOneof("kind") == "hello"  # type: ignore[union-attr]
    await r.send(wire.Request(request_id=2, create=wire.CreateSegmentRequest(segment="p")))

    def append(rid: int, data: bytes) -> wire.Request:
        return wire.Request(request_id=rid, append=wire.AppendRequest(segment="p", data=data))

    for i in range(50):
        await r.send(append(10 + i, bytes([i]) * 7))
    rid = 60
    await r.send(wire.Request(request_id=rid, seal=wire.SealRequest(segment="p")))
    rid += 1
    for _ in range(10):
        await r.send(append(rid, b"late"))
        rid += 1
    responses = [await r.receive() for _ in range(62)]
    assert [x.request_id for x in responses] == [2, *range(10, rid)], "responses out of order"  # type: ignore[union-attr]
    appends = responses[1:51]
    assert [x.append.offset for x in appends] == [i * 7 for i in range(50)]  # type: ignore[union-attr]
    assert responses[51].info.sealed and responses[51].info.length == 350  # type: ignore[union-attr]
    assert all(x.error.code == wire.SEGMENT_SEALED for x in responses[52:])  # type: ignore[union-attr]
    await r.stream.aclose()


async def expect_closed_with(r: Raw, code: int) -> None:
    resp = await r.receive()
    assert resp is not None and resp.WhichOneof("kind") == "error", resp
    assert resp.error.code == code, resp
    assert await r.receive() is None, "the server must close the connection"
    await r.stream.aclose()


async def test_first_request_must_be_hello(server: Served) -> None:
    r = await raw(server.address)
    await r.send(wire.Request(request_id=5, create=wire.CreateSegmentRequest(segment="x")))
    await expect_closed_with(r, wire.BAD_REQUEST)
    async with open_client(server.address) as c:
        with pytest.raises(SegmentNotFound):
            await c.info("x")


async def test_unsupported_protocol_version(server: Served) -> None:
    r = await raw(server.address)
    await r.send(wire.Request(request_id=1, hello=wire.Hello(protocol_version=99)))
    await expect_closed_with(r, wire.UNSUPPORTED)


async def test_oversize_message_is_refused_and_nothing_applied(server: Served) -> None:
    r = await raw(server.address)
    await r.hello()
    big = wire.Request(request_id=3, append=wire.AppendRequest(segment="x", data=bytes(2 << 20)))
    data = big.SerializeToString()
    await r.send_bytes(struct.pack(">I", len(data)) + data[:1000])
    await expect_closed_with(r, wire.TOO_LARGE)


async def test_undecodable_and_unknown_requests(server: Served) -> None:
    r = await raw(server.address)
    await r.hello()
    await r.send_bytes(struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff")
    await expect_closed_with(r, wire.MALFORMED)
    r = await raw(server.address)
    await r.hello()
    await r.send(wire.Request(request_id=9))  # no kind: an unknown request type
    await expect_closed_with(r, wire.UNSUPPORTED)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One protobuf field, encoded by hand (to get the wire type wrong on purpose)."""
    if wire_type == 2:
        payload = varint(len(payload)) + payload
    return varint(number << 3 | wire_type) + payload


def _append_with(rid: int, *fields: bytes) -> bytes:
    """A framed Request(request_id, append=AppendRequest(segment="w", *fields))."""
    inner = _field(1, 2, b"w") + b"".join(fields)
    body = _field(1, 0, varint(rid)) + _field(4, 2, inner)
    return struct.pack(">I", len(body)) + body


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fields", "size"),
    [
        # The data as a varint: parsed as an empty append before.
        ((_field(15, 0, varint(5)),), "small"),
        # The same behind 70 KiB of a field this version does not know, so
        # the message takes the large-append path.
        ((_field(100, 2, bytes(70 * 1024)), _field(15, 0, varint(5))), "large"),
        # Good data, then the data again as a fixed32: protobuf dropped the second.
        ((_field(15, 2, bytes(70 * 1024)), _field(15, 5, b"abcd")), "large"),
        ((_field(15, 1, b"12345678"),), "small"),
    ],
)
async def test_field_with_wrong_wire_type_is_refused(
    server: Served, fields: tuple[bytes, ...], size: str
) -> None:
    """Issue item 14: a known field with the wrong wire type is malformed, not ignored."""
    message = _append_with(7, *fields)
    assert (len(message) >= 64 * 1024) == (size == "large")
    async with open_client(server.address) as c:
        await c.create("w")
    r = await raw(server.address)
    await r.hello()
    await r.send_bytes(message)
    resp = await r.receive()
    assert resp is not None and resp.request_id == 7, resp
    assert resp.error.code == wire.BAD_REQUEST, resp
    assert "AppendRequest.data (15) has wire type" in resp.error.message, resp.error.message
    # Nothing was appended, and the connection still serves.
    await r.send(wire.Request(request_id=8, get_info=wire.GetInfoRequest(segment="w")))
    info = await r.receive()
    assert info is not None and info.request_id == 8, info
    assert info.info.length == 0 and info.info.event_count == 0, info
    await r.stream.aclose()
    assert server.container.info("w").length == 0


async def test_unknown_field_numbers_are_still_accepted(server: Served) -> None:
    """Fields this version does not know (a newer client's) are ignored, as protobuf does."""
    async with open_client(server.address) as c:
        await c.create("w")
    r = await raw(server.address)
    await r.hello()
    for rid, pad in ((3, 10), (4, 70 * 1024)):
        await r.send_bytes(_append_with(rid, _field(100, 2, bytes(pad)), _field(15, 2, b"ok")))
        resp = await r.receive()
        assert resp is not None and resp.WhichOneof("kind") == "append", resp
    await r.stream.aclose()
    assert server.container.info("w").length == 4


async def test_cut_message_then_eof_does_not_hurt_others(server: Served) -> None:
    async with open_client(server.address) as good:
        await good.create("ok")
        r = await raw(server.address)
        await r.hello()
        await r.send_bytes(struct.pack(">I", 100) + b"\x08\x01")
        await r.stream.send_eof()
        resp = await r.receive()
        assert resp is None or resp.WhichOneof("kind") == "error"
        await r.stream.aclose()
        assert (await good.append("ok", b"still fine")).length == 10


async def test_token(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, server={"token": "s3cret"})
    async with served(config) as s:
        r = await raw(s.address)
        await r.send(wire.Request(request_id=1, create=wire.CreateSegmentRequest(segment="x")))
        await expect_closed_with(r, wire.UNAUTHORIZED)
        r = await raw(s.address)
        await r.send(wire.Request(request_id=1, hello=wire.Hello(protocol_version=1, token="no")))
        await expect_closed_with(r, wire.UNAUTHORIZED)
        with pytest.raises(Unauthorized):
            async with open_client(s.address, token="wrong"):
                pass
        async with open_client(s.address, token="s3cret") as c:
            await c.create("x")
            assert (await c.info("x")).name == "x"


async def test_max_connections(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, server={"max_connections": 2})
    async with served(config) as s, open_client(s.address), open_client(s.address):
        r = await raw(s.address)
        await expect_closed_with(r, wire.LIMIT_EXCEEDED)


async def test_connection_lost_fails_pending_requests(server: Served) -> None:
    async with open_client(server.address) as c:
        await c.create("s")
        fut = await c.start_append("s", b"x")
        await fut.wait()
        await c.aclose()
        with pytest.raises(ConnectionLost):
            await c.info("s")


# -- malformed input against a live daemon process --------------------------------


@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = Daemon(tmp_path_factory.mktemp("fuzz"), '[server]\nmax_message_bytes = "1 MiB"\n'
               '[container]\nmax_append_bytes = "512 KiB"\n')  # fmt: skip
    d.start()
    with SyncClient(d.address) as c:
        c.create("fuzz/ok")
    yield d
    code = d.stop()
    assert code == 0, d.log()


def _request_bytes() -> st.SearchStrategy[bytes]:
    """Junk and near-valid requests, each with a length prefix (sometimes a lie)."""
    valid = st.builds(
        lambda rid, seg, data: wire.Request(
            request_id=rid, append=wire.AppendRequest(segment=seg, data=data)
        ).SerializeToString(),
        st.integers(0, 2**64 - 1),
        st.text(max_size=30),
        st.binary(max_size=100),
    )
    body = st.one_of(st.binary(max_size=300), valid, valid.map(lambda b: b[: len(b) // 2]))
    return st.one_of(
        body.map(lambda b: struct.pack(">I", len(b)) + b),
        st.tuples(st.integers(0, 2**32 - 1), body).map(lambda t: struct.pack(">I", t[0]) + t[1]),
        st.binary(max_size=20),
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hello_first=st.booleans(), junk=st.lists(_request_bytes(), min_size=1, max_size=4))
def test_malformed_input_never_hurts_the_daemon(
    live_daemon: Daemon, hello_first: bool, junk: list[bytes]
) -> None:
    with socket.create_connection(("127.0.0.1", live_daemon.port), timeout=5) as s:
        if hello_first:
            hello = wire.Request(request_id=1, hello=wire.Hello(protocol_version=1))
            data = hello.SerializeToString()
            s.sendall(struct.pack(">I", len(data)) + data)
        try:
            for j in junk:
                s.sendall(j)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(65536):
                pass
        except OSError:
            pass  # the server may close on us mid-send: fine
    assert live_daemon.alive(), live_daemon.log()
    with SyncClient(live_daemon.address) as c:
        before = c.info("fuzz/ok").length
        assert c.append("fuzz/ok", b"still serving").length == before + 13


def test_sync_client_round_trip(live_daemon: Daemon) -> None:
    with SyncClient(live_daemon.address) as c:
        name = f"sync/{uuid.uuid4().hex}"
        c.create(name)
        assert c.append(name, b"abc").offset == 0
        assert c.append(name, b"def").offset == 3
        assert c.truncate(name, 1).start_offset == 1
        assert c.seal(name).sealed
        assert name in [i.name for i in c.list("sync/")]
        c.delete(name)
        with pytest.raises(SegmentNotFound):
            c.info(name)


def test_every_request_kind_has_a_handler() -> None:
    """The server's handler table covers wire.proto's Request kinds, and nothing else."""
    from gateway.server import HANDLERS

    kinds = {f.name for f in wire.Request.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert kinds - {"hello"} == set(HANDLERS)
    # Each kind is either prepared and answered once, or answered as a stream.
    assert all((h.prepare is None) != (h.stream is None) for h in HANDLERS.values())
