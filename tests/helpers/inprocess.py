"""Run the container, storage writer and protocol server inside the test's trio loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from gateway.config import Config
from gateway.node import open_node
from gateway.server import Server
from gateway.storage.interface import ChunkStorage
from gateway.storage.layer import ChunkLayer
from gateway.tier2.storage_writer import StorageWriter
from tests.helpers.container import DirectContainer


@dataclass
class Served:
    container: DirectContainer
    server: Server
    address: str


@asynccontextmanager
async def served(config: Config) -> AsyncIterator[Served]:
    """The container and a server on a free loopback port."""
    async with open_node(config, container_type=DirectContainer) as node:
        container = node.container
        server = Server(container, config.server, config.container.max_append_bytes)
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(server.serve)
            host, port = addresses[0]
            try:
                yield Served(container, server, f"{host}:{port}")
            finally:
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def running(
    config: Config, storage: ChunkStorage
) -> AsyncIterator[tuple[DirectContainer, StorageWriter]]:
    """The container and its storage writer over ``storage`` (no server)."""
    layer = ChunkLayer(storage, max_concurrency=4, retry_deadline=config.tier2.retry_deadline)
    async with open_node(config, layer, container_type=DirectContainer) as node:
        writer = node.storage_writer
        assert writer is not None
        yield node.container, writer
