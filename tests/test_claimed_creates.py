"""Pipelined creates in a cluster: claims overlap, creates keep their order.

A server with name claims (in-process, claims on the in-memory binding)
gets creates on one connection without waiting for answers. Answers come
back in order; a create whose claim finishes late is still prepared before
the creates read after it (segment ids tell), and of two creates of one
name the second fails with SegmentExists; the creates share the journal's
group commits instead of one fdatasync each.
"""

from __future__ import annotations

import pathlib
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest
import trio
import trio.testing

from gateway.buffers import Buffer
from gateway.cluster.claims import NameClaims, claim_key
from gateway.node import open_node
from gateway.protocol import wire_pb2 as wire
from gateway.server import Server
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from tests.helpers.container import DirectContainer
from tests.helpers.inprocess import served as served_alone
from tests.helpers.segments import make_config
from tests.helpers.wait import async_wait_for

pytestmark = pytest.mark.timeout(60)


class SlowClaims(MemoryStorage):
    """Claims of names in ``slow`` take ``delay`` seconds."""

    def __init__(self, slow: set[str], delay: float) -> None:
        super().__init__()
        self.slow = {claim_key(n) for n in slow}
        self.delay = delay

    def write_if_absent(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> bool:
        if key in self.slow:
            time.sleep(self.delay)
        return super().write_if_absent(key, data, metadata)


class Raw:
    """A bare protocol connection: requests sent without waiting for answers."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, req: wire.Request) -> None:
        data = req.SerializeToString()
        await self.stream.send_all(struct.pack(">I", len(data)) + data)

    async def receive(self) -> wire.Response:
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    msg, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    return wire.Response.FromString(msg)
            chunk = await self.stream.receive_some(65536)
            assert chunk, "the server closed the connection"
            self.buf += chunk


async def connect(address: str) -> Raw:
    host, port = address.rsplit(":", 1)
    r = Raw(await trio.open_tcp_stream(host, int(port)))
    await r.send(wire.Request(request_id=1, hello=wire.Hello(protocol_version=1)))
    assert (await r.receive()).WhichOneof("kind") == "hello"
    return r


class Cluster:
    def __init__(self, container: DirectContainer, claims: NameClaims, address: str) -> None:
        self.container, self.claims, self.address = container, claims, address


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    config = make_config(tmp_path)
    storage = SlowClaims({"slow"}, 0.3)
    claims = NameClaims(ChunkLayer(storage, retry_deadline=5.0), "n1", 1)
    async with open_node(config, container_type=DirectContainer) as node:
        server = Server(node.container, config.server, config.container.max_append_bytes,
                        node="n1", claims=claims)  # fmt: skip
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(server.serve)
            host, port = addresses[0]
            try:
                yield Cluster(node.container, claims, f"{host}:{port}")
            finally:
                nursery.cancel_scope.cancel()


def create(rid: int, name: str) -> wire.Request:
    return wire.Request(request_id=rid, create=wire.CreateSegmentRequest(segment=name))


async def test_pipelined_creates_keep_their_order_whatever_their_claims_take(
    served: Cluster,
) -> None:
    r = await connect(served.address)
    async with r.stream:
        await pipelined_creates_in_order(r, served)


async def pipelined_creates_in_order(r: Raw, served: Cluster) -> None:
    await r.send(create(2, "slow"))  # its claim takes 0.3 s
    await r.send(create(3, "fast"))
    await r.send(create(4, "fast"))  # the same name again: refused
    await r.send(create(5, "bad//name"))
    await r.send(wire.Request(request_id=6, append=wire.AppendRequest(segment="fast", data=b"x")))
    await r.send(create(7, "slow"))
    answers = [await r.receive() for _ in range(6)]
    assert [a.request_id for a in answers] == [2, 3, 4, 5, 6, 7]
    assert [a.WhichOneof("kind") for a in answers] == [
        "info", "info", "error", "error", "append", "error",
    ]  # fmt: skip
    assert answers[2].error.code == wire.SEGMENT_EXISTS
    assert answers[3].error.code == wire.INVALID_NAME
    assert answers[4].append.offset == 0
    assert answers[5].error.code == wire.SEGMENT_EXISTS
    # Prepared in the order read: the slow claim's segment got the lower id.
    assert answers[0].info.id < answers[1].info.id
    assert served.container.info("fast").length == 1
    # Answered creates are no longer in flight: their claims are releasable.
    await trio.testing.wait_all_tasks_blocked()
    assert not served.claims.in_flight("slow") and not served.claims.in_flight("fast")
    assert await served.claims.owner("fast") == "n1"


async def test_pipelined_creates_share_group_commits(served: Cluster) -> None:
    r = await connect(served.address)
    async with r.stream:
        await many_creates(r, served)


async def many_creates(r: Raw, served: Cluster) -> None:
    journal = served.container.journal
    before = journal.statistics().groups
    n = 64
    await r.send(create(9, "slow"))  # the others' claims end while it waits
    for i in range(n):
        await r.send(create(10 + i, f"many/{i:03d}"))
    answers = [await r.receive() for _ in range(n + 1)]
    assert [a.request_id for a in answers] == list(range(9, 10 + n))
    assert all(a.WhichOneof("kind") == "info" for a in answers), answers
    ids = [a.info.id for a in answers]
    assert ids == sorted(ids)
    # Not one fdatasync per create: they were prepared as their claims ended.
    assert journal.statistics().groups - before < n // 2


async def test_a_refused_create_leaves_no_name_in_flight(served: Cluster) -> None:
    other = NameClaims(served.claims.layer, "n2", 1)
    await other.claim("theirs")
    r = await connect(served.address)
    async with r.stream:
        await r.send(create(2, "mine"))
        await r.send(create(3, "theirs"))  # another node holds it
        await r.send(create(4, "mine"))  # a second create of one name
        await r.send(create(5, ".txn/mine"))  # claimed, then refused by the container
        answers = [await r.receive() for _ in range(4)]
    assert [a.WhichOneof("kind") for a in answers] == ["info", "error", "error", "error"]
    assert answers[1].error.code == wire.SEGMENT_EXISTS and "n2" in answers[1].error.message
    assert answers[2].error.code == wire.SEGMENT_EXISTS
    assert answers[3].error.code == wire.INVALID_NAME
    await trio.testing.wait_all_tasks_blocked()
    assert not served.claims.in_flight("mine") and not served.claims.in_flight("theirs")
    assert served.claims._in_flight == {}  # no count left over, none below zero
    # The refused create's claim is released; the others stay.
    await async_wait_for(
        released(served.claims, ".txn/mine"), 5, "the refused create's claim released"
    )
    assert await served.claims.owner("mine") == "n1"
    assert await served.claims.owner("theirs") == "n2"


def released(claims: NameClaims, name: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await claims.owner(name) is None

    return check


async def test_create_and_delete_of_one_name_pipelined_leave_the_claim_right(
    served: Cluster,
) -> None:
    """Create then delete: released. Delete then create: the claim stays if the
    create made the segment (it may fail: the deletion is not durable yet)."""
    await served.claims.claim("x")
    await served.claims.claim("y")
    r = await connect(served.address)
    async with r.stream:
        await r.send(create(2, "x"))
        await r.send(wire.Request(request_id=3, delete=wire.DeleteRequest(segment="x")))
        await r.send(create(4, "y"))
        await r.send(wire.Request(request_id=5, delete=wire.DeleteRequest(segment="y")))
        await r.send(create(6, "y"))
        answers = [await r.receive() for _ in range(5)]
    assert [a.WhichOneof("kind") for a in answers[:4]] == ["info", "done", "info", "done"]
    assert await served.claims.owner("x") is None  # deleted: the name is free
    created = answers[4].WhichOneof("kind") == "info"
    if not created:
        assert answers[4].error.code == wire.SEGMENT_EXISTS
    await served.claims.retry_releases(
        lambda name: name in {s.name for s in served.container.segments()}
    )
    assert (await served.claims.owner("y") == "n1") is created
    assert served.claims.unreleased == set()


async def test_delete_then_create_of_one_name_pipelined_creates_it(tmp_path: pathlib.Path) -> None:
    """Requests on one connection take effect in order: the create follows the delete."""
    async with served_alone(make_config(tmp_path)) as s:
        r = await connect(s.address)
        async with r.stream:
            await r.send(create(2, "y"))
            await r.send(wire.Request(request_id=3, delete=wire.DeleteRequest(segment="y")))
            await r.send(create(4, "y"))
            answers = [await r.receive() for _ in range(3)]
    assert [a.WhichOneof("kind") for a in answers] == ["info", "done", "info"], answers[2]
