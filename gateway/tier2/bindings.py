"""Opening the Tier-2 binding that ``[tier2] url`` names.

- ``embedded``: SeaweedFS as a supervised child process
  (`gateway.embedded`), data under ``<node.data_dir>/s3``, reached
  through the S3 binding with the identity kept there;
- ``s3://BUCKET[/PREFIX]``: the S3 binding (``endpoint_url`` for S3-compatible
  servers; credentials from the usual AWS sources);
- ``file:///PATH``: the filesystem binding.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import trio

from gateway.config import Config
from gateway.storage.interface import ChunkStorage
from gateway.storage.layer import ChunkLayer

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3


@asynccontextmanager
async def open_tier2(config: Config) -> AsyncIterator[ChunkLayer]:
    """The configured binding behind a `ChunkLayer`; the embedded server lives as long."""
    t = config.tier2
    async with AsyncExitStack() as stack:
        storage: ChunkStorage
        barrier: Callable[[], None] | None = None
        embedded: EmbeddedS3 | None = None
        if t.url == "embedded":
            from gateway.embedded import run_embedded_s3
            from gateway.storage.s3 import S3Storage

            embedded = await stack.enter_async_context(
                run_embedded_s3(pathlib.Path(config.node.data_dir) / "s3", port=t.embedded_port)
            )
            storage = S3Storage(
                embedded.bucket,
                # A proxy in front of the embedded server (embedded_port), if
                # one is configured: the torture test injects S3 faults there.
                endpoint_url=t.endpoint_url or embedded.endpoint_url,
                region=t.region,
                max_pool_connections=t.max_concurrency,
                timeout=t.request_timeout,
                access_key=embedded.access_key,
                secret_key=embedded.secret_key,
            )
            barrier = embedded.sync
        elif t.url.startswith("s3://"):
            from gateway.storage.s3 import S3Storage

            storage = S3Storage.from_url(
                t.url,
                endpoint_url=t.endpoint_url,
                region=t.region,
                max_pool_connections=t.max_concurrency,
                timeout=t.request_timeout,
            )
        else:
            from gateway.storage.filesystem import FileStorage

            storage = FileStorage.from_url(t.url)
        layer = ChunkLayer(
            storage,
            max_concurrency=t.max_concurrency,
            retry_deadline=t.retry_deadline,
            barrier=barrier,
            embedded=embedded,
        )
        try:
            yield layer
        finally:
            await trio.to_thread.run_sync(storage.close)
