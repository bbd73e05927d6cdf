"""Small trio helpers shared by the daemon's services."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def service_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for a service's background tasks that raises callers' errors as-is.

    Services run background tasks that never raise (they record failures in
    their state), so an error leaving the nursery comes from the caller's own
    ``async with`` body. Trio wraps it in an ExceptionGroup; unwrap a lone
    exception so that ``except JournalCorrupt`` and friends work as expected.
    """
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
