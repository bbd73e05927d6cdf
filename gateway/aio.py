"""Small trio helpers shared by the daemon's services."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


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
