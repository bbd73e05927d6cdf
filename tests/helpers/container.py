"""A segment container that tests call directly: each operation prepared and waited for.

`DirectContainer` is a `SegmentContainer` with one awaitable method per
operation (``create``, ``append``, ``seal`` ...). Each admits its request
the way the server does (`SegmentContainer.admit`: wait for room, load the
attribute values it needs, prepare) and waits until it is durable. Build it
like a container (`DirectContainer(config, table, journal)`), or open a node
with it (`open_node(config, container_type=DirectContainer)`,
`tests.helpers.inprocess`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.buffers import Buffer
from gateway.container.attributes import AttributeUpdate
from gateway.container.container import SegmentContainer
from gateway.container.results import AppendResult, SegmentInfo, StreamInfo, TransactionInfo
from gateway.protocol.codec import Codec


class DirectContainer(SegmentContainer):
    """A container with prepare-and-wait methods, for tests."""

    async def create(
        self, name: str, attributes: Sequence[AttributeUpdate] = (), codec: Codec = Codec.RAW
    ) -> SegmentInfo:
        """Create a segment."""
        op = await self.admit(lambda: self.prepare_create(name, attributes, codec), 1024)
        info: SegmentInfo = await op.wait()
        return info

    async def append(self, name: str, data: Buffer, **kwargs: Any) -> AppendResult:
        """Append; keyword arguments as in `prepare_append`."""
        op = await self.admit(lambda: self.prepare_append(name, data, **kwargs), len(data) + 1024)
        result: AppendResult = await op.wait()
        return result

    async def seal(self, name: str) -> SegmentInfo:
        """Seal a segment."""
        op = await self.admit(lambda: self.prepare_seal(name), 64)
        info: SegmentInfo = await op.wait()
        return info

    async def truncate(self, name: str, offset: int) -> SegmentInfo:
        """Truncate a segment at ``offset``."""
        op = await self.admit(lambda: self.prepare_truncate(name, offset), 64, reserved=True)
        info: SegmentInfo = await op.wait()
        return info

    async def delete(self, name: str) -> None:
        """Delete a segment."""
        op = await self.admit(lambda: self.prepare_delete(name), 64, reserved=True)
        await op.wait()

    async def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> SegmentInfo:
        """Update attributes."""
        op = await self.admit(
            lambda: self.prepare_update_attributes(name, updates), 64 + 40 * len(updates)
        )
        info: SegmentInfo = await op.wait()
        return info

    async def create_stream(
        self,
        name: str,
        policy: Mapping[str, int | None] | None = None,
        codec: Codec = Codec.RAW,
    ) -> StreamInfo:
        """Create a stream (policies and codec as in `prepare_set_stream`)."""
        op = await self.admit(
            lambda: self.prepare_set_stream(name, policy or {}, create=True, codec=codec), 1024
        )
        info: StreamInfo = await op.wait()
        return info

    async def set_stream(self, name: str, policy: Mapping[str, int | None]) -> StreamInfo:
        """Change a stream's policies."""
        op = await self.admit(lambda: self.prepare_set_stream(name, policy), 1024)
        info: StreamInfo = await op.wait()
        return info

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and its segments."""
        op = await self.admit(lambda: self.prepare_delete_stream(name), 64, reserved=True)
        await op.wait()

    async def roll(self, name: str) -> StreamInfo:
        """Seal a stream's current segment now."""
        op = await self.admit(lambda: self.prepare_roll(name), 64)
        info: StreamInfo = await op.wait()
        return info

    async def begin(self, parent: str, txn_timeout: float = 0.0) -> TransactionInfo:
        """Start a transaction on a segment or stream (aborted after ``txn_timeout`` s)."""
        op = await self.admit(lambda: self.prepare_begin(parent, txn_timeout), 1024)
        info: TransactionInfo = await op.wait()
        return info

    async def commit(self, name: str) -> TransactionInfo:
        """Commit a transaction (merge it into its parent)."""
        op = await self.admit(lambda: self.prepare_commit(name), 1024)
        info: TransactionInfo = await op.wait()
        return info

    async def abort(self, name: str) -> None:
        """Abort a transaction."""
        op = await self.admit(lambda: self.prepare_abort(name), 64, reserved=True)
        await op.wait()
