"""Tier 2 on a real SeaweedFS: bulk byte-exactness, an outage, and injected faults.

The container runs in-process; the S3 server is a real ``weed`` on loopback
(the session's, or a dedicated one that the outage test stops for 30 s).
"""

from __future__ import annotations

import math
import pathlib
import random
import shutil
from typing import Any

import pytest
import trio

from gateway.embedded import EmbeddedS3
from gateway.errors import Overloaded
from gateway.storage.interface import ChunkStorage
from gateway.storage.s3 import S3Storage
from tests.helpers.inprocess import running
from tests.helpers.s3proxy import S3FaultProxy
from tests.helpers.segments import make_config
from tests.test_tier2_writer import chunk_bytes, read_all

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB


def s3_config(data_dir: pathlib.Path, journal: dict[str, Any] | None = None, **tier2: Any) -> Any:
    values: dict[str, Any] = {
        "flush_size": "256 KiB",
        "flush_interval": "1s",
        "max_chunk_size": "4 MiB",
        "retry_deadline": "5s",
        "request_timeout": "5s",
        "snapshot_interval": "5s",
        "gc_interval": "1h",
    }
    values.update(tier2)
    return make_config(
        data_dir,
        tier2=values,
        cache={"budget": "256 MiB"},
        journal={"file_size": "16 MiB", "max_pending_bytes": "32 MiB", **(journal or {})},
    )


async def ingest(
    c: Any,
    names: list[str],
    total: int,
    rng: random.Random,
    acked: dict[str, bytearray],
    until: float = math.inf,
) -> None:
    """Random event sizes into random segments until ``total`` bytes are acknowledged
    (or the trio clock passes ``until``: checked between appends, never cancelling one,
    since an append cancelled while it waits to be durable may still land)."""
    done = 0
    while done < total and trio.current_time() < until:
        name = rng.choice(names)
        piece = rng.randbytes(rng.choice([rng.randrange(1, 300), rng.randrange(1, 200 * KiB)]))
        try:
            await c.append(name, piece)
        except Overloaded:
            await trio.sleep(0.05)
            continue
        acked[name] += piece
        done += len(piece)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_bulk_ingest_is_byte_exact_in_s3_and_after_cache_wipe(
    tmp_path: pathlib.Path, s3_storage: S3Storage
) -> None:
    # 64 MiB (not more: the claim is byte-exactness, not volume) over 50
    # segments: every segment is many chunks (one per flush, S3 has no
    # append; 8+ measured), events of up to 200 KiB straddle chunk ends, the
    # 4 MiB journal files roll ~16 times, and the 4 MiB reads after the wipe
    # cross chunks.
    config = s3_config(tmp_path, journal={"file_size": "4 MiB"})
    rng = random.Random(50)
    names = [f"bulk/{i:02d}" for i in range(50)]
    acked = {n: bytearray() for n in names}
    async with running(config, s3_storage) as (c, writer):
        for n in names:
            await c.create(n)
        await ingest(c, names, 64 * MiB, rng, acked)
        await c.flush()
        for n in names:
            assert c.info(n).storage_length == len(acked[n])
            assert c.info(n).chunk_count >= 2, n
            # Straight from the objects, with boto3.
            assert chunk_bytes(s3_storage, c, n) == acked[n], n
        assert writer.flush_failures == 0
    shutil.rmtree(config.cache_dir)
    async with running(config, s3_storage) as (c, _):
        for n in names:
            assert await read_all(c, n, len(acked[n]), 4 * MiB) == acked[n], n


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_s3_outage_of_30s_loses_nothing(tmp_path: pathlib.Path) -> None:
    server = EmbeddedS3(tmp_path / "weed")
    await trio.to_thread.run_sync(server.start)
    try:
        storage = S3Storage(
            server.bucket,
            endpoint_url=server.endpoint_url,
            access_key=server.access_key,
            secret_key=server.secret_key,
            timeout=2.0,
        )
        config = s3_config(
            tmp_path / "node",
            retry_deadline="1s",
            request_timeout="1s",
            flush_interval="200ms",
        )
        rng = random.Random(30)
        names = [f"o/{i}" for i in range(5)]
        acked = {n: bytearray() for n in names}
        async with running(config, storage) as (c, writer):
            for n in names:
                await c.create(n)
            await ingest(c, names, 8 * MiB, rng, acked)
            await c.flush()
            await trio.to_thread.run_sync(server.stop)
            # Down for 30 s while appends keep landing in the journal.
            until = trio.current_time() + 30
            while trio.current_time() < until:
                await ingest(c, names, 1 * MiB, rng, acked, until)
                await trio.sleep(0.5)
            during = writer.statistics()
            assert during.flush_failures > 0
            assert during.unflushed_bytes > 0
            await trio.to_thread.run_sync(server.start)
            await ingest(c, names, 4 * MiB, rng, acked)
            with trio.fail_after(120):
                while True:
                    try:
                        await c.flush()
                        break
                    except Exception:  # retried until the server is back for good
                        await trio.sleep(0.5)
            for n in names:
                assert c.info(n).storage_length == len(acked[n])
                assert chunk_bytes(storage, c, n) == acked[n], n
    finally:
        await trio.to_thread.run_sync(server.stop)


@pytest.mark.timeout(200)
async def test_slowdown_and_dropped_connections_are_retried(
    tmp_path: pathlib.Path, s3_storage: S3Storage, seaweedfs: EmbeddedS3
) -> None:
    with S3FaultProxy(seaweedfs.endpoint_url, seed=7) as proxy:
        storage: ChunkStorage = S3Storage(
            s3_storage.bucket,
            endpoint_url=proxy.endpoint_url,
            access_key=seaweedfs.access_key,
            secret_key=seaweedfs.secret_key,
            timeout=5.0,
        )
        config = s3_config(tmp_path, retry_deadline="20s", flush_interval="100ms")
        rng = random.Random(503)
        names = [f"f/{i}" for i in range(8)]
        acked = {n: bytearray() for n in names}
        proxy.fail(None, fraction=0.3)
        proxy.fail(None, fraction=0.1, retry_after=0.05)
        proxy.drop(None, when="request", fraction=0.1)
        proxy.drop(None, when="response", fraction=0.1)
        async with running(config, storage) as (c, writer):
            for n in names:
                await c.create(n)
            await ingest(c, names, 16 * MiB, rng, acked)
            await c.flush()
            proxy.clear()
            for n in names:
                assert chunk_bytes(s3_storage, c, n) == acked[n], n
            assert sum(proxy.injected.values()) > 20, proxy.injected
            assert writer.layer.statistics().retries > 20
            # Reads through the faults too, from Tier 2 after the cache lost them.
        shutil.rmtree(config.cache_dir)
        proxy.fail(None, fraction=0.3)
        proxy.drop(None, when="response", fraction=0.1)
        async with running(config, storage) as (c, _):
            for n in names:
                assert await read_all(c, n, len(acked[n]), 1 * MiB) == acked[n], n
