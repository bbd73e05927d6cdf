"""Segments: create, append, read, seal, truncate, delete, info, record, list, changes.

Each handler prepares its request now (in arrival order: validation and
journal submission happen here) and returns how to answer it later.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import trio

from gateway.buffers import Buffer
from gateway.cluster import feed
from gateway.cluster.remote import TAIL_READ_TIMEOUT
from gateway.container import AppendResult
from gateway.container.results import ReadResult
from gateway.container.segment_names import validate_prefix
from gateway.errors import GatewayError, SegmentNotFound
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import encode_read_response

from ..answers import Item, Producer, pending_info, ready
from ..budget import LIST_ENTRY_BYTES
from ..registry import handles, streams
from ..routing import find_remote, not_owner
from .convert import codec, updates

if TYPE_CHECKING:
    from ..context import Peer

MAX_LIST = 10_000
#: A read request is answered with at most this much, in pieces of READ_PIECE.
MAX_READ = 64 * 1024 * 1024
READ_PIECE = 1024 * 1024


def _creates(req: wire.Request) -> str:
    return req.create.segment


@handles("create", changes=True, claims_name=_creates)
def create(conn: Peer, req: wire.Request) -> Producer:
    """Create a segment (in a cluster, once its name is claimed)."""
    op = conn.server.container.prepare_create(
        req.create.segment, updates(list(req.create.attributes)), codec(req.create.codec)
    )
    return pending_info(req.request_id, op)


@handles("append", changes=True)
def append(conn: Peer, req: wire.Request) -> Producer:
    """Append (large appends come by `append_data` without their data copied)."""
    return append_data(conn, req.request_id, req.append, req.append.data)


def append_data(conn: Peer, rid: int, a: wire.AppendRequest, data: Buffer) -> Producer:
    """An append whose data may be a view of the message it came in."""
    op = conn.server.container.prepare_append(
        a.segment,
        data,
        expected_offset=a.expected_offset if a.HasField("expected_offset") else None,
        attribute_updates=updates(list(a.attribute_updates)),
        writer_id=a.writer_id,
        event_number=a.event_number,
        previous_event_number=a.previous_event_number,
        event_count=a.event_count,
    )

    async def produce() -> wire.Response:
        r: AppendResult = await op.wait()
        return wire.Response(
            request_id=rid,
            append=wire.AppendResponse(offset=r.offset, length=r.length, segment=r.segment),
        )

    return produce


def _read_bytes(conn: Peer, req: wire.Request) -> int:
    # The piece held at a time, and its head.
    return min(req.read.max_length, MAX_READ, READ_PIECE) + 1024


@streams("read", answer_bytes=_read_bytes)
def read(conn: Peer, req: wire.Request) -> Item:
    """Read, in pieces of at most READ_PIECE (another node's segment as the mount does)."""
    r = req.read
    rid = req.request_id
    server = conn.server
    container = server.container

    async def read(name: str, offset: int, size: int, wait: float) -> ReadResult:
        try:
            return await container.read(name, offset, size, wait=wait)
        except SegmentNotFound:
            # Another node's segment: read it as this node's mount does.
            found = await find_remote(server, name)
            if found is None:
                raise
            node, seg = found
            if server.cluster is not None:
                await server.cluster.reach(node)
            return await node.read_result(seg, offset, size, wait)

    async def stream() -> AsyncGenerator[list[bytes], None]:
        offset = r.offset
        remaining = min(r.max_length, MAX_READ)
        wait = r.wait_ms / 1000
        while True:
            result = await read(r.segment, offset, min(remaining, READ_PIECE), wait)
            wait = 0.0  # only the first piece waits at the tail
            offset += len(result.data)
            remaining -= len(result.data)
            last = not result.data or remaining <= 0 or offset >= result.length
            head = wire.ReadResponse(
                offset=result.offset,
                length=result.length,
                start_offset=result.start_offset,
                sealed=result.sealed,
                last=last,
            )
            yield encode_read_response(rid, head, result.data)
            if last:
                return

    return Item(rid, 0, None, stream=stream)


@handles("seal", changes=True)
def seal(conn: Peer, req: wire.Request) -> Producer:
    """Seal a segment."""
    return pending_info(req.request_id, conn.server.container.prepare_seal(req.seal.segment))


@handles("truncate", changes=True, frees=True)
def truncate(conn: Peer, req: wire.Request) -> Producer:
    """Truncate a segment (offsets are kept; may free journal space)."""
    t = req.truncate
    return pending_info(req.request_id, conn.server.container.prepare_truncate(t.segment, t.offset))


@handles("delete", changes=True, frees=True)
def delete(conn: Peer, req: wire.Request) -> Producer:
    """Delete a segment; in a cluster its name is free for every node again."""
    name = req.delete.segment
    op = conn.server.container.prepare_delete(name)
    rid = req.request_id
    claims = conn.server.claims

    async def produce() -> wire.Response:
        await op.wait()
        if claims is not None:
            await claims.release(name)  # the name is free for every node again
        return wire.Response(request_id=rid, done=wire.Done())

    return produce


@handles("get_info")
def get_info(conn: Peer, req: wire.Request) -> Producer:
    """A segment's info, this node's or another's."""
    name = req.get_info.segment
    rid = req.request_id
    server = conn.server
    try:
        info = server.container.info(name)
    except SegmentNotFound as e:
        if server.cluster is None:
            raise
        missing = e

        async def produce() -> wire.Response:
            found = await find_remote(server, name)
            if found is None:
                # Not followed here: NOT_OWNER (or OWNER_DOWN) if its claim names a node.
                raise await not_owner(server, missing) from None
            node, seg = found
            # From the owner while it answers (as fresh as a local one),
            # else what this node knows of it.
            assert server.cluster is not None
            await server.cluster.reach(node)
            remote = seg.info()
            client = node.client
            if client is not None:
                with trio.move_on_after(TAIL_READ_TIMEOUT), contextlib.suppress(GatewayError):
                    remote = await client.info(name)
            return wire.Response(request_id=rid, info=remote.to_wire())

        return produce
    return ready(wire.Response(request_id=rid, info=info.to_wire()))


@handles("get_record")
def get_record(conn: Peer, req: wire.Request) -> Producer:
    """A segment's metadata record (what other nodes follow)."""
    # This node's segments only: other nodes ask each owner.
    response = wire.Response(
        request_id=req.request_id,
        record=conn.server.container.record(req.get_record.segment),
    )
    return ready(response)


def _page_bytes(conn: Peer) -> int:
    return min(feed.PAGE_BYTES, conn.server.config.max_message_bytes // 2)


def _changes_bytes(conn: Peer, req: wire.Request) -> int:
    # The records of a page, as objects and on the wire (a page may pass its
    # size by one change): an estimate like a listing's, for the changes a
    # page may hold, within the page's bound.
    limit = min(req.changes.limit or feed.DEFAULT_LIMIT, feed.MAX_LIMIT)
    most = min(limit, conn.server.container.segment_count + 1)
    return min(3 * _page_bytes(conn), 2 * most * LIST_ENTRY_BYTES)


@handles("changes", answer_bytes=_changes_bytes)
def changes(conn: Peer, req: wire.Request) -> Producer:
    """What changed among this node's own segments since a cursor (how nodes follow it)."""
    rid = req.request_id
    container = conn.server.container
    page_bytes = _page_bytes(conn)

    async def produce() -> wire.Response:
        # Built at its turn, like a listing: it includes everything this
        # connection asked for before.
        page = feed.changes_page(container, req.changes, page_bytes)
        return wire.Response(request_id=rid, changes=page)

    return produce


def _list_bytes(conn: Peer, req: wire.Request) -> int:
    limit = min(req.list.limit or MAX_LIST, MAX_LIST)
    return min(limit, conn.server.container.segment_count) * LIST_ENTRY_BYTES


@handles("list", answer_bytes=_list_bytes)
def list_segments(conn: Peer, req: wire.Request) -> Producer:
    """Segments by name prefix, in name order, every node's unless local only."""
    r = req.list
    rid = req.request_id
    server = conn.server
    container = server.container
    limit = min(r.limit or MAX_LIST, MAX_LIST)
    validate_prefix(r.prefix)  # fail now, in order

    async def produce() -> wire.Response:
        # Built when its turn to be answered comes, not when it is read:
        # queued answers would hold memory nobody may be reading. It
        # includes everything this connection asked for before.
        infos = container.list(r.prefix, r.start_after, limit + 1)
        cluster = server.cluster
        if cluster is not None and not r.local_only:
            # Other nodes' segments too; a name held twice shows once.
            names = {i.name for i in infos}
            infos += [
                seg.info()
                for seg in cluster.segments()
                if seg.name.startswith(r.prefix)
                and seg.name > r.start_after
                and seg.name not in names
            ]
            infos = sorted(infos, key=lambda i: i.name)[: limit + 1]
        return wire.Response(
            request_id=rid,
            list=wire.SegmentList(
                segments=[i.to_wire() for i in infos[:limit]],
                truncated=len(infos) > limit,
            ),
        )

    return produce
