"""Small trio helpers shared by the daemon's services."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import crc32c
import trio

from gateway.buffers import Buffer


@asynccontextmanager
async def service_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for a service's background tasks that raises callers' errors as-is.

    Services run background tasks that raise at most one error between them
    (most record failures in their state instead), so an error leaving the
    nursery is usually alone: the caller's own ``async with`` body, or the
    one failing task. Trio wraps it in an ExceptionGroup; unwrap a lone
    exception so that ``except JournalCorrupt`` and friends work as expected.
    """
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


#: A CRC over more than this runs in a worker thread.
CRC_INLINE_BYTES = 1024 * 1024


async def crc32c_of(data: Buffer, value: int = 0) -> int:
    """CRC32C of ``data`` continued from ``value``, off the event loop when large.

    crc32c releases the GIL on large buffers, so a worker thread frees the
    loop; for small ones the thread's round trip would cost more than the CRC.
    """
    if len(data) <= CRC_INLINE_BYTES:
        return int(crc32c.crc32c(data, value))
    return int(await trio.to_thread.run_sync(crc32c.crc32c, data, value))
