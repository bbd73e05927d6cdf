"""fsck on a running daemon: the checks run inside it, on its live state.

The daemon answers an ``FsckRequest`` (gateway/protocol/wire.proto) by
running checks 2-7 (`gateway.fsck.checks`) on its committed metadata, its
Tier-2 binding and its cache, and streams the findings back. Only repairs
that the daemon makes by itself anyway are allowed here: deleting garbage
older than ``tier2.gc_grace`` (what GC does) and dropping cache blocks
(what a chunk deletion does). The journal is checked by the command from
the files (it is read-only and safe while the daemon writes).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from cache import CacheStore
from gateway.config import Tier2Config
from gateway.container.container import SegmentContainer
from gateway.container.segment import chunks_of
from gateway.errors import GatewayError
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import ChunkReader
from gateway.tier2.storage_writer import StorageWriter

from .checks import Options, Target, run_target_checks
from .report import Event, FsckRecord, Tally, to_wire

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims

log = logging.getLogger(__name__)


def live_target(
    container: SegmentContainer,
    store: CacheStore | None = None,
    writer: StorageWriter | None = None,
    reader: ChunkReader | None = None,
    name_claims: NameClaims | None = None,
) -> Target:
    """The running daemon's state as a check target.

    ``store``: its cache store; ``writer``, ``reader``: its Tier 2;
    ``name_claims``: its cluster-wide name claims (None: not claimed).
    """

    def alive(name: str) -> bool:
        try:
            container.check_exists(name)
        except GatewayError:
            return False
        return True

    def chunks_now() -> dict[str, ChunkRecord]:
        return {c.name: c for s in container.segments() for c in chunks_of(s)}

    def forget_chunk(key: str) -> None:
        if reader is not None:
            reader.drop_chunk(key)

    if writer is None:
        return Target(
            online=True,
            node="",
            tier2=Tier2Config(),
            snapshot=container.committed_snapshot,
            read_index=container.read_index,
            layer=None,
            store=store,
            chunks_now=chunks_now,
            no_tier2="Tier 2 is not running in this daemon",
        )
    return Target(
        online=True,
        node=writer.node,
        tier2=writer.cfg,
        snapshot=container.committed_snapshot,
        read_index=container.read_index,
        layer=writer.layer,
        store=store,
        chunks_now=chunks_now,
        # Objects the optimizer replaced are kept through GC's grace too, and
        # those queued for deletion are going (a retired object's grace runs
        # from its replacement, so it may be older than GC's overdue age).
        uploading=lambda: (
            set(writer.uploading) | set(writer.optimizer.retired) | writer.housekeeping.deleting()
        ),
        forget_chunk=forget_chunk,
        alive=alive,
        name_claims=name_claims,
    )


async def serve_fsck(
    target: Target,
    request: wire.FsckRequest,
    request_id: int,
    send: Callable[[bytes], Awaitable[None]],
    record: FsckRecord | None = None,
) -> None:
    """Answer one FsckRequest: every event as a Response, then the closing one.

    A run that completes is kept in ``record``.
    """
    tally = Tally()

    async def sink(event: Event) -> None:
        tally.add(event)
        response = wire.Response(request_id=request_id, fsck=to_wire(event))
        await send(response.SerializeToString())

    options = Options(deep=request.deep, repair=request.repair)
    try:
        await run_target_checks(target, options, sink)
    except (GatewayError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        raise  # answered, or the connection is gone: the server handles both
    except Exception as e:
        # A bug in a check must cost this request only, never the daemon.
        log.exception("fsck failed")
        raise GatewayError(f"fsck failed in the daemon: {e!r} (see its log)") from e
    if record is not None:
        record.record(tally)
    closing = wire.Response(request_id=request_id, fsck=wire.FsckResponse(last=True))
    await send(closing.SerializeToString())
