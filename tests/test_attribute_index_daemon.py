"""Attributes at scale with real daemons: 100,000 writers, SIGKILL, failpoints, the CLI."""

from __future__ import annotations

import pathlib
import random

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.container.attributes import AttributeUpdate, Verb
from gateway.errors import ConditionalCheckFailed, GatewayError, Overloaded
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from tests.helpers.daemon import Daemon, run_cli, scrape
from tests.helpers.wait import wait_for

# Daemons: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

CONFIG = """
[container]
max_attributes = {max_attributes}
[tier2]
url = "file://{root}"
flush_interval = "2s"
snapshot_interval = "0s"
gc_interval = "300ms"
gc_grace = "0s"
"""

WRITERS = 100_000
WINDOW = 2000


def writer_ids(n: int, seed: int) -> list[bytes]:
    """``n`` distinct random 16-byte writer ids (never a core id)."""
    rng = random.Random(seed)
    ids = {b"\x01" + rng.randbytes(15) for _ in range(n)}
    while len(ids) < n:
        ids.add(b"\x01" + rng.randbytes(15))
    return sorted(ids, key=lambda _: rng.random())


async def append_all(address: str, name: str, writes: list[tuple[bytes, int]]) -> None:
    """Each (writer, previous event number) appends its next event; Overloaded ones again."""
    async with open_client(address) as c:
        pending = writes
        while pending:
            again = []
            for i in range(0, len(pending), WINDOW):
                window = pending[i : i + WINDOW]
                futures = [
                    await c.start_append(
                        name, b"e", writer_id=w, event_number=p + 1, previous_event_number=p
                    )
                    for w, p in window
                ]
                for item, f in zip(window, futures, strict=True):
                    try:
                        await f.wait()
                    except Overloaded:
                        again.append(item)
            if again:
                await trio.sleep(0.2)
            pending = again


@pytest.mark.timeout(600)
async def test_hundred_thousand_writers_survive_sigkill(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "tier2"
    daemon = Daemon(tmp_path / "node", CONFIG.format(root=root, max_attributes=4096))
    ids = writer_ids(WRITERS, 19)
    try:
        await trio.to_thread.run_sync(daemon.start)
        async with open_client(daemon.address) as c:
            await c.create("many")
        await append_all(daemon.address, "many", [(w, 0) for w in ids])
        # Every tenth writer writes a second event.
        await append_all(daemon.address, "many", [(w, 1) for w in ids[::10]])
        expected_events = WRITERS + len(ids[::10])
        # Writers' values went to the index and came back (memory holds 4,096).
        m = await trio.to_thread.run_sync(scrape, daemon.metrics_port)
        p = "segment_gateway_"
        assert m[p + "attributes_loaded_total"] >= len(ids[::10]) // 2
        assert m[p + "attribute_index_batches_total"] >= WRITERS // 4096
        daemon.kill()
        await trio.to_thread.run_sync(daemon.start)
        async with open_client(daemon.address) as c:
            assert (await c.info("many")).event_count == expected_events
            # Old writers reconnect and retry their first event: duplicates,
            # answered with the event number stored for them.
            for i in (0, 1, 7, 10, 12_345, WRITERS - 1):
                f = await c.start_append(
                    "many", b"e", writer_id=ids[i], event_number=1, previous_event_number=0
                )
                with pytest.raises(ConditionalCheckFailed) as e:
                    await f.wait()
                assert getattr(e.value, "last_event_number", None) == (2 if i % 10 == 0 else 1)
            assert (await c.info("many")).event_count == expected_events
            extended = {k: v async for k, v in c.iter_attributes("many", batch=10_000) if k[0]}
            assert len(extended) == WRITERS
            assert sum(extended.values()) == expected_events
            await c.flush("many")
            items, more = await c.attribute_range("many", b"\x01" + bytes(15), 5)
            assert len(items) == 5 and more == sorted(extended)[5]
        # Far more attributes than memory holds, all in the index; fsck agrees.
        result = await trio.to_thread.run_sync(
            lambda: run_cli("fsck", "--connect", daemon.address, "--deep", timeout=300)
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "attribute-index" in result.stdout
    finally:
        daemon.kill()


@pytest.mark.timeout(300)
def test_kill_between_index_upload_and_journal_keeps_a_consistent_tree(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "tier2"
    storage = FileStorage(root)
    config = CONFIG.format(root=root, max_attributes=64)
    first = writer_ids(200, 1)
    second = writer_ids(200, 2)
    daemon = Daemon(tmp_path / "node", config)
    daemon.start()
    try:
        with SyncClient(daemon.address) as c:
            c.create("s")
            for w in first:
                c.append("s", b"a", writer_id=w, event_number=1, previous_event_number=0)
            c.flush("s")
    finally:
        daemon.stop()
    before = {o.key for o in storage.list(names.attributes_prefix("node-1"))}
    assert before

    # Nothing indexed by itself this time: the flush below makes the batch.
    quiet = CONFIG.format(root=root, max_attributes=1024).replace('"2s"', '"1h"')
    crashing = Daemon(
        tmp_path / "node",
        quiet,
        port=daemon.port,
        env={"SEGMENT_GATEWAY_FAILPOINTS": "after_attribute_upload=kill"},
    )
    crashing.start()
    try:
        with SyncClient(crashing.address) as c:
            for w in second:
                c.append("s", b"b", writer_id=w, event_number=1, previous_event_number=0)
            for w in first[:50]:
                c.append("s", b"c", writer_id=w, event_number=2, previous_event_number=1)
            with pytest.raises(GatewayError):
                c.flush("s")  # the batch is uploaded, then the daemon dies
        assert crashing.proc is not None
        crashing.proc.wait(timeout=60)
        assert crashing.proc.returncode == -9
    finally:
        crashing.kill()
    orphans = {o.key for o in storage.list(names.attributes_prefix("node-1"))} - before
    assert orphans  # the batch nobody journaled

    daemon = Daemon(tmp_path / "node", config, port=daemon.port)
    daemon.start()
    try:
        with SyncClient(daemon.address) as c:
            want = {w: 2 for w in first[:50]} | {w: 1 for w in first[50:]} | {w: 1 for w in second}
            assert c.get_attributes("s", list(want)) == want
            assert c.info("s").event_count == 450
            with pytest.raises(ConditionalCheckFailed):
                c.append("s", b"x", writer_id=second[3], event_number=1, previous_event_number=0)
            c.flush("s")
        daemon.kill()  # the values now come from the index alone
        daemon.start()
        with SyncClient(daemon.address) as c:
            assert c.get_attributes("s", list(want)) == want
        result = run_cli("fsck", "--connect", daemon.address, "--deep", timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        # GC removed the orphan (gc_grace 0).
        wait_for(
            lambda: not {o.key for o in storage.list(names.attributes_prefix("node-1"))} & orphans,
            20,
            "the orphan batch removed",
            interval=0.1,
        )
    finally:
        daemon.kill()


@pytest.mark.timeout(120)
def test_attrs_command_and_bad_input(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "tier2"
    daemon = Daemon(tmp_path / "node", CONFIG.format(root=root, max_attributes=64))
    daemon.start()
    ids = sorted(writer_ids(40, 3))
    try:
        with SyncClient(daemon.address) as c:
            c.create("s")
            for w in ids:
                c.append("s", b"e", writer_id=w, event_number=5, previous_event_number=0)
            c.flush("s")
            c.update_attributes("s", [AttributeUpdate(ids[0], Verb.REMOVE, 0)])
        out = run_cli("attrs", "s", "--connect", daemon.address)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.split()
        rows = [(lines[i], lines[i + 1]) for i in range(0, len(lines), 2)]
        assert [k for k, _ in rows[1:]] == [w.hex() for w in ids[1:]]  # after the event count
        assert all(v == "5" for _, v in rows[1:])
        page = run_cli("attrs", "s", "--from", ids[10].hex(), "--limit", "3", "--connect",
                       daemon.address)  # fmt: skip
        assert page.returncode == 0
        assert page.stdout.split()[::2] == [w.hex() for w in ids[10:13]]
        assert f"--from {ids[13].hex()}" in page.stderr
        for bad in (["--from", "xyz"], ["--from", "00ff"], ["--limit", "-1"]):
            r = run_cli("attrs", "s", *bad, "--connect", daemon.address)
            assert r.returncode != 0 and r.stderr.strip(), bad
        r = run_cli("attrs", "nope", "--connect", daemon.address)
        assert r.returncode != 0 and "nope" in r.stderr
        stat = run_cli("stat", "s", "--connect", daemon.address)
        assert stat.returncode == 0 and '"attributes"' in stat.stdout
    finally:
        daemon.kill()


@pytest.mark.timeout(180)
def test_cli_appends_never_run_out_of_attributes(tmp_path: pathlib.Path) -> None:
    # The repro: each `append` is a new exactly-once writer, whose id
    # stays on the segment. With max_attributes = 8, the eighth used to fail.
    root = tmp_path / "tier2"
    daemon = Daemon(tmp_path / "node", CONFIG.format(root=root, max_attributes=8))
    daemon.start()
    try:
        for i in range(12):
            r = run_cli("append", "--create", "s", "--connect", daemon.address,
                        input_text=f"line {i}\n")  # fmt: skip
            assert r.returncode == 0, (i, r.stderr)
        with SyncClient(daemon.address) as c:
            assert c.info("s").event_count == 12
            assert c.read("s", 0, 1000).data == b"".join(b"line %d\n" % i for i in range(12))
        out = run_cli("attrs", "s", "--connect", daemon.address)
        writers = [line for line in out.stdout.splitlines() if not line.startswith("0" * 30)]
        assert len(writers) == 12, out.stdout
    finally:
        daemon.kill()
