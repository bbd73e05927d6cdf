"""Exactly-once under faults: cut connections, SIGKILLed and restarted daemon."""

from __future__ import annotations

import pathlib
import random

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.writer import open_segment_writer

from .helpers.daemon import Daemon
from .helpers.proxy import DroppingProxy

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

EVENTS = 100_000
KILLS = 6


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_every_event_exactly_once_through_faults(tmp_path: pathlib.Path) -> None:
    daemon = Daemon(tmp_path / "node", "[journal]\ncheckpoint_every_frames = 100\n")
    rng = random.Random(2026)
    try:
        await trio.to_thread.run_sync(daemon.start)
        async with open_client(daemon.address) as c:
            await c.create("eo/stream")
        proxy = DroppingProxy(daemon.port, drop_after=(0.05, 0.6), seed=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            writing_done = trio.Event()
            killed = [trio.Event() for _ in range(KILLS)]

            async def chaos() -> None:
                for k in range(KILLS):
                    await trio.sleep(rng.uniform(0.4, 1.2))
                    if writing_done.is_set():
                        break
                    daemon.kill()
                    proxy.drop_all()
                    await trio.sleep(rng.uniform(0.0, 0.3))
                    await trio.to_thread.run_sync(daemon.start)
                    killed[k].set()

            nursery.start_soon(chaos)
            async with open_segment_writer(
                f"127.0.0.1:{proxy.port}",
                "eo/stream",
                codec="lines",
                max_batch_bytes=4096,
                linger=0.001,
            ) as writer:
                per_kill = EVENTS // (KILLS + 1)
                for i in range(EVENTS):
                    await writer.write(b"e%06d" % i)
                    if i % 500 == 499:
                        await trio.sleep(0.02)  # spread the run over the faults
                    # However fast this machine writes, the kills land while
                    # events are being written: wait for the k-th kill before
                    # writing past the k-th slice of the events.
                    if i % per_kill == per_kill - 1 and (i + 1) // per_kill <= KILLS:
                        await killed[(i + 1) // per_kill - 1].wait()
            writing_done.set()
            stats = writer.statistics()
            nursery.cancel_scope.cancel()
        if not daemon.alive():
            # The chaos task was cancelled between a kill and its restart.
            await trio.to_thread.run_sync(daemon.start)
        assert stats["acked_event"] == EVENTS
        assert daemon.starts >= 4, "the daemon was not killed enough times"
        assert stats["reconnects"] >= 5, stats
        assert proxy.drops >= 5
        async with open_client(daemon.address) as c:
            info = await c.info("eo/stream")
            # Through the read path: part of it may be in Tier 2 by now.
            data = (await c.read("eo/stream", 0, info.length)).data
        assert info.event_count == EVENTS
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()
    lines = data.split(b"\n")
    assert lines[-1] == b""
    got = lines[:-1]
    expected = [b"e%06d" % i for i in range(EVENTS)]
    if got != expected:
        dupes = len(got) - len(set(got))
        missing = len(set(expected) - set(got))
        pytest.fail(f"{len(got)} events stored, {dupes} duplicated, {missing} missing")
