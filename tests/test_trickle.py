"""Issue 33's trickle workload: 1,000 slow segments, each flushed many times, on S3.

One node (``node-w``) owns 1,000 segments and gets a small append (200-400
bytes) to every one of them each second (``ROUND``), with
``tier2.flush_interval`` lowered to 0.3 s: S3 objects never grow, so every
flush of a segment is a new small object, and the storage optimizer merges
them meanwhile (``defrag_interval`` 0.2 s). The trickle goes on until the
node made 20 flushes per segment, then the test checks what a user of the
bucket would: the chunk objects per segment (listed with boto3) stay within
the optimizer's bound while the segments are active, and within the issue's
``2 + size / max_chunk_size`` once half of them are sealed; every byte reads
back through the protocol and through a second node's (``node-r``) mount,
during the trickle and after a restart with an empty cache; and
``fsck --deep`` finds nothing.

The bound for an active segment, from the optimizer's rule (`pick_run`): a
stretch of small chunks (below ``defrag_small``) is merged once it has
``defrag_min_chunks`` of them and none holds more than half its bytes. So,
once the optimizer has looked, a segment holds

- its full-size chunks (merged ones of at least ``defrag_small``): at most
  size / ``defrag_small``;
- small ones: each merge at least doubles the size a byte sits in, so the
  small ones left form at most log2(``defrag_small`` / smallest flush)
  levels, plus fewer than ``defrag_min_chunks`` not yet worth merging;
- its tail, the last chunk, which the optimizer leaves to the flushes.

That holds while a flush is smaller than ``defrag_small`` and
``defrag_min_chunks`` of them fit ``max_chunk_size`` (here a flush is a few
appends, 1-3 KiB, against 16 KiB and 4 x 16 KiB <= 64 KiB).

With 1,000 segments it takes minutes on a 2-core machine (260 s here,
shared): 20,000 flushes at the ~150-250 uploads a second the storage writer
manages here, then the optimizer catching up (``tier2.defrag_concurrency``
segments at once).
So the suite runs it with 200 segments (~80 s), and
``SEGMENT_GATEWAY_TRICKLE_SEGMENTS=1000`` runs the issue's size.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import random
import shutil
import statistics
from collections.abc import AsyncIterator
from typing import Any

import boto3
import pytest
import trio

from gateway.client.client import Client, ResponseFuture, open_client
from gateway.embedded import EmbeddedS3
from tests.helpers.cluster import Cluster
from tests.helpers.daemon import scrape
from tests.helpers.mount import require_fuse, run
from tests.helpers.wait import wait_for
from tests.test_fsck import assert_clean, fsck

pytestmark = pytest.mark.slow

KiB = 1024
SEGMENTS = int(os.environ.get("SEGMENT_GATEWAY_TRICKLE_SEGMENTS", "200"))
#: Flushes per segment (on average) before the trickle stops.
FLUSHES = 20
#: Sizes of one append: the smallest is the smallest possible flush.
APPEND = (200, 400)
#: ``tier2.flush_interval``, seconds.
FLUSH_INTERVAL = 0.3
#: Seconds between two rounds of appends (one to every segment: an event a second,
#: the issue's sensor fleet). The writer takes longer than this to go round 1,000
#: segments (~200 flushes/s here), so each flush holds one append or a few.
ROUND = 1.0
MAX_CHUNK = 64 * KiB
SMALL = 16 * KiB
MIN_CHUNKS = 4
CONNECTIONS = 4
#: Seconds the optimizer may take to catch up once the trickle stops. It merges one
#: run at a time: ~3 merges/s here while 1,000 segments flush, ~10-15/s after.
SETTLE = 300
TASKS = 32
WRITER, READER = "node-w", "node-r"

TIER2 = f"""flush_interval = "{FLUSH_INTERVAL}s"
flush_size = "64 KiB"
flush_concurrency = 16
max_concurrency = 32
max_chunk_size = "{MAX_CHUNK // KiB} KiB"
snapshot_interval = "5s"
gc_interval = "1h"  # no orphans to find: no listing of 1,000 segments every pass
gc_grace = "2s"  # node-r may read replaced objects until its next refresh
defrag_min_chunks = {MIN_CHUNKS}
defrag_small = "{SMALL // KiB} KiB"
defrag_rate = "256 MiB"
defrag_interval = "200ms"
"""

#: The optimizer's bound for an active segment of ``size`` bytes (see the module's docstring).
ACTIVE_BOUND_SMALL = math.ceil(math.log2(SMALL / APPEND[0])) + MIN_CHUNKS


def active_bound(size: int) -> int:
    """Chunk objects an active segment of ``size`` bytes keeps once the optimizer looked."""
    return size // SMALL + ACTIVE_BOUND_SMALL + 1


def sealed_bound(size: int) -> float:
    """The issue's bound for a segment sealed (and merged) in Tier 2."""
    return 2 + size / MAX_CHUNK


@contextlib.asynccontextmanager
async def connections(address: str) -> AsyncIterator[list[Client]]:
    """CONNECTIONS protocol clients of ``address``."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_client(address)) for _ in range(CONNECTIONS)]


async def each(address: str, names: list[str], one: Any) -> list[Any]:
    """``await one(client, name)`` for every name, TASKS at a time over CONNECTIONS."""
    out: list[Any] = [None] * len(names)
    todo = iter(enumerate(names))

    async def worker(client: Client) -> None:
        for i, name in todo:
            out[i] = await one(client, name)

    async with connections(address) as clients, trio.open_nursery() as nursery:
        for k in range(TASKS):
            nursery.start_soon(worker, clients[k % CONNECTIONS])
    return out


async def read_all(client: Client, name: str) -> bytes:
    """Every byte of ``name`` through the protocol."""
    length = (await client.info(name)).length
    out = bytearray()
    while len(out) < length:
        piece = (await client.read(name, len(out), length - len(out))).data
        assert piece, f"{name}: empty read at {len(out)} < {length}"
        out += piece
    return bytes(out)


class Trickle:
    """The writer's side: what each segment holds, one round of appends at a time."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.data = {n: bytearray() for n in names}
        self.rng = random.Random(33)
        self.rounds = 0

    async def round(self, clients: list[Client]) -> None:
        """One append to every segment, pipelined; returns once all are acknowledged."""
        futures: list[tuple[str, bytes, ResponseFuture]] = []
        for i, name in enumerate(self.names):
            piece = self.rng.randbytes(self.rng.randrange(*APPEND))
            futures.append((name, piece, await clients[i % CONNECTIONS].start_append(name, piece)))
        for name, piece, f in futures:
            r = await f.wait()
            assert r.append.offset == len(self.data[name]), name
            self.data[name] += piece
        self.rounds += 1


def flushes(writer_metrics: dict[str, float], chunk_counts: list[int]) -> int:
    """Chunks the writer's flushes made: each merge replaced some by one."""
    p = "segment_gateway_defrag_"
    return int(
        sum(chunk_counts)
        + writer_metrics[p + "chunks_replaced_total"]
        - writer_metrics[p + "runs_total"]
    )


def objects_per_segment(s3: Any, bucket: str) -> dict[int, int]:
    """Chunk objects in the bucket by segment id (boto3, as a user counts them)."""
    per: dict[int, int] = {}
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"gw/{WRITER}/chunks/"
    )
    for page in pages:
        for o in page.get("Contents", []):
            seg = int(o["Key"].split("/")[3])
            per[seg] = per.get(seg, 0) + 1
    return per


@pytest.mark.timeout(1200)
async def test_a_thousand_trickling_segments_stay_few_objects_and_read_back(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> None:
    require_fuse()
    cluster = Cluster(tmp_path, seaweedfs, nodes=(WRITER, READER))
    writer = cluster.daemons[WRITER]
    text = writer.config_path.read_text().replace('flush_interval = "24h"\n', TIER2)
    text = text.replace("snapshot_interval = 0\n", "")
    writer.config_path.write_text(text)
    reader = cluster.daemons[READER]
    s3 = boto3.client(
        "s3",
        endpoint_url=seaweedfs.endpoint_url,
        aws_access_key_id=seaweedfs.access_key,
        aws_secret_access_key=seaweedfs.secret_key,
        region_name="us-east-1",
    )
    names = [f"fleet/sensor{i:04d}" for i in range(SEGMENTS)]
    trickle = Trickle(names)

    async def listing() -> dict[str, Any]:
        async with open_client(writer.address) as c:
            return {s.name: s for s in await c.list("fleet/", local_only=True)}

    async def settled() -> tuple[dict[str, Any], dict[int, int]]:
        """Wait until the optimizer is done and the replaced objects are gone."""
        last: list[Any] = []

        async def still() -> bool:
            infos = await listing()
            per = await trio.to_thread.run_sync(objects_per_segment, s3, cluster.bucket)
            m = await trio.to_thread.run_sync(scrape, writer.metrics_port)
            now = (
                sorted((s.id, s.chunk_count) for s in infos.values()),
                m["segment_gateway_defrag_runs_total"],
            )
            same = bool(last) and last[0][0] == now
            print(
                f"settling: {now[1]:.0f} merges, {sum(per.values())} objects, "
                f"{sum(s.chunk_count for s in infos.values())} named"
            )
            last[:] = [(now, infos, per)]
            return same and all(per.get(s.id, 0) == s.chunk_count for s in infos.values())

        deadline = trio.current_time() + SETTLE
        while trio.current_time() < deadline:  # polled: another process's state
            if await still():
                return last[0][1], last[0][2]
            await trio.sleep(1.0)
        raise AssertionError(f"the optimizer not done within {SETTLE} s: {last[0][0][1]} merges")

    took: dict[str, float] = {}
    clock = [trio.current_time()]

    def lap(what: str) -> None:
        now = trio.current_time()
        took[what] = round(now - clock[0], 1)
        clock[0] = now

    try:
        # node-r starts when the trickle is half done: following 1,000 changing
        # segments from the start would take CPU the flushes need.
        await trio.to_thread.run_sync(writer.start, 60)
        await each(writer.address, names, lambda c, n: c.create(n))
        lap("start, create")
        # The trickle: a round every ROUND s until the flushes made 20 objects per segment.
        with trio.fail_after(420):
            async with connections(writer.address) as clients:
                checked_midway = False
                every = max(1, round(3 / ROUND))  # count the flushes every ~3 s
                while True:
                    due = trio.current_time() + ROUND
                    await trickle.round(clients)
                    if trickle.rounds % every:
                        await trio.sleep_until(due)
                        continue
                    m = await trio.to_thread.run_sync(scrape, writer.metrics_port)
                    made = flushes(m, [s.chunk_count for s in (await listing()).values()])
                    print(
                        f"{trio.current_time() - clock[0]:.0f} s: {trickle.rounds} rounds, "
                        f"{made / SEGMENTS:.1f} flushes per segment, "
                        f"{m['segment_gateway_defrag_runs_total']:.0f} merges"
                    )
                    if not checked_midway and made >= FLUSHES * SEGMENTS // 2:
                        # While the optimizer works: node-r's mount reads only
                        # bytes that were appended, from the first on.
                        await trio.to_thread.run_sync(reader.start, 60)
                        sample = [reader.mnt / n for n in names[:: SEGMENTS // 10]]
                        await trio.to_thread.run_sync(
                            lambda: wait_for(
                                lambda: run("stat", *sample, check=False).returncode == 0,
                                30,
                                "node-r's view",
                            )
                        )
                        for n in names[:: SEGMENTS // 10]:
                            path = reader.mnt / n
                            out = await trio.to_thread.run_sync(lambda: run("cat", path).stdout)
                            assert out, f"{n}: nothing shown on node-r"
                            assert trickle.data[n].startswith(out), f"{n}: wrong bytes on node-r"
                        await trio.to_thread.run_sync(reader.stop)
                        checked_midway = True
                    if made >= FLUSHES * SEGMENTS:
                        break
        lap("trickle")
        await each(writer.address, names[:1], lambda c, n: c.flush(""))
        infos, per = await settled()
        lap("settle")
        m = scrape(writer.metrics_port)
        made = flushes(m, [s.chunk_count for s in infos.values()])
        counts = [per[infos[n].id] for n in names]
        sizes = [infos[n].length for n in names]
        print(
            f"{trickle.rounds} rounds, {made / SEGMENTS:.1f} flushes per segment, "
            f"{statistics.mean(sizes):.0f} bytes per segment; active: objects per segment "
            f"mean {statistics.mean(counts):.2f}, median {statistics.median(counts)}, "
            f"max {max(counts)} (bound {active_bound(max(sizes))}); "
            f"{m['segment_gateway_defrag_runs_total']:.0f} merges"
        )
        assert made >= FLUSHES * SEGMENTS
        assert m["segment_gateway_defrag_runs_total"] > 0
        assert m["segment_gateway_defrag_failures_total"] == 0
        for n in names:
            assert infos[n].length == len(trickle.data[n]) == infos[n].storage_length
            assert per[infos[n].id] <= active_bound(infos[n].length), (n, per[infos[n].id])
        # A few flushes more after the merges, then half of them sealed: packed.
        async with connections(writer.address) as clients:
            for _ in range(3):
                await trickle.round(clients)
                await trio.sleep(2 * ROUND)
        sealed = names[::2]
        closed = set(sealed)
        await each(writer.address, sealed, lambda c, n: c.seal(n))
        await each(writer.address, names[:1], lambda c, n: c.flush(""))
        infos, per = await settled()
        lap("more, seal, settle")
        sealed_counts = [per[infos[n].id] for n in sealed]
        active_counts = [per[infos[n].id] for n in names[1::2]]
        print(
            f"sealed: objects per segment mean {statistics.mean(sealed_counts):.2f}, "
            f"max {max(sealed_counts)}; active: mean {statistics.mean(active_counts):.2f}, "
            f"max {max(active_counts)}"
        )
        for n in names:
            info = infos[n]
            assert info.length == len(trickle.data[n]) == info.storage_length
            assert info.sealed_in_storage == (n in closed)
            bound = sealed_bound(info.length) if info.sealed else active_bound(info.length)
            assert per[info.id] <= bound, (n, per[info.id], info.length)
        # Every byte through the protocol.
        got = await each(writer.address, names, read_all)
        for n, data in zip(names, got, strict=True):
            assert data == trickle.data[n], n
        lap("read back")
        # And through node-r's mount, its cache wiped: every byte from the merged objects.
        shutil.rmtree(reader.data_dir / "cache")
        await trio.to_thread.run_sync(reader.start, 60)
        paths = [reader.mnt / n for n in names]
        want = [str(len(trickle.data[n])) for n in names]

        def sizes_shown() -> bool:
            return run("stat", "-c", "%s", *paths, check=False).stdout.decode().split() == want

        await trio.to_thread.run_sync(lambda: wait_for(sizes_shown, 30, "node-r's view"))
        out = await trio.to_thread.run_sync(lambda: run("cat", *paths, timeout=120).stdout)
        assert out == b"".join(trickle.data[n] for n in names)
        lap("node-r, cold")
        assert await trio.to_thread.run_sync(writer.stop) == 0, writer.log()
    finally:
        await trio.to_thread.run_sync(cluster.teardown)
    report = await trio.to_thread.run_sync(
        lambda: fsck(
            writer.config_path, "--deep", "--data-dir", str(writer.data_dir), env=cluster.env
        )
    )
    lap("fsck --deep")
    print(f"seconds: {took}")
    assert_clean(report)
