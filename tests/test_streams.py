"""Streams and transactions on a real daemon: the mount, the CLI, Tier 2, crashes.

The container's own rules are in tests/test_streams_unit.py; here the same
behaviour is checked as a user sees it -- through the protocol, the mounted
files, `segment-gateway` commands, the objects in Tier 2 and `fsck` -- and
across SIGKILLs at every step of a transaction's merge.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import SegmentNotFound
from gateway.storage import object_keys as names
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import Daemon
from tests.helpers.mount import mounted_daemon, require_fuse
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

KiB = 1024

CONFIG = """
[tier2]
url = "file://{root}"
flush_size = "16 KiB"
flush_interval = "{flush_interval}"
snapshot_interval = "0s"
gc_interval = "200ms"
gc_grace = "0s"
[streams]
interval = "100ms"
"""


def config(root: pathlib.Path, flush_interval: str = "100ms") -> str:
    return CONFIG.format(root=root, flush_interval=flush_interval)


def cli(daemon: Daemon, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--connect", daemon.address],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def fsck_clean(daemon: Daemon) -> None:
    r = cli(daemon, "fsck", "--deep", "--json")
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_a_stream_through_the_mount_the_cli_and_retention(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage
) -> None:
    """On S3 (SeaweedFS): after retention every view agrees and the newest bytes stay."""
    require_fuse()
    s3_config = config(tmp_path).replace(
        f'url = "file://{tmp_path}"',
        f'url = "s3://{s3_storage.bucket}/gw"\nendpoint_url = "{seaweedfs.endpoint_url}"',
    )
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    with mounted_daemon(tmp_path, s3_config, env=env) as d:
        r = cli(d, "stream", "create", "clicks", "--roll-size", "8KiB")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["roll_size"] == 8 * KiB
        events = [b"event %06d " % i + b"x" * 1000 + b"\n" for i in range(60)]
        with SyncClient(d.address) as c:
            landed = [c.append("clicks", e).segment for e in events[:30]]
            assert landed[0] == "clicks/000000000001" and len(set(landed)) == 4
            info = c.stream("clicks")
            names_now = [s.name for s in info.segments]
            # The mount shows the stream as a directory, in creation order.
            listed = sorted(os.listdir(d.mnt / "clicks"))
            assert ["clicks/" + n for n in listed] == names_now
            # Rolled segments are sealed; the mount says so.
            first = d.mnt / names_now[0]
            assert os.getxattr(first, "user.segment.sealed") == b"1"
            assert os.getxattr(d.mnt / names_now[-1], "user.segment.sealed") == b"0"
            whole = b"".join((d.mnt / n).read_bytes() for n in names_now)
            assert whole == b"".join(events[:30])
            for e in events[30:]:
                c.append("clicks", e)
            c.flush()
            # Retention from now on (every 100 ms): keep at least the newest 20 KiB.
            r = cli(d, "stream", "set", "clicks", "--retain-size", "20KiB")
            assert json.loads(r.stdout)["own"] == {"roll_size": 8 * KiB, "retain_size": 20 * KiB}

            def retained() -> bool:
                segs = c.stream("clicks").segments
                # Done: without its oldest segment the stream would hold too little.
                return sum(x.length for x in segs[1:]) < 20 * KiB

            wait_for(retained, 20, "retention")
            kept = c.stream("clicks").segments
            kept_bytes = b"".join(c.read(s.name, 0, 1 << 20).data for s in kept)
            assert len(kept_bytes) >= 20 * KiB
            assert b"".join(events).endswith(kept_bytes)
            # Every view agrees: mount, ls, stat, the Tier-2 snapshot and fsck.
            wait_for(
                lambda: (
                    sorted(os.listdir(d.mnt / "clicks")) == [s.name.split("/")[1] for s in kept]
                ),
                20,
                "the mount to drop deleted segments",
            )
            r = cli(d, "ls", "clicks/", "--json")
            assert [json.loads(line)["name"] for line in r.stdout.splitlines()] == [
                s.name for s in kept
            ]
            gone = "clicks/000000000001"
            assert cli(d, "stat", gone).returncode != 0
            # The deleted segments' chunks leave the bucket (segment ids are in the keys).
            ids = {s.id for s in kept}
            prefix = "gw/" + names.chunks_prefix("node-1")
            wait_for(
                lambda: {int(o.key.split("/")[3]) for o in s3_storage.list(prefix)} <= ids,
                20,
                "the deleted segments' chunks to go",
            )
            assert {int(o.key.split("/")[3]) for o in s3_storage.list(prefix)} == ids
        fsck_clean(d)


def test_cli_transactions_and_stream_commands(tmp_path: pathlib.Path) -> None:
    require_fuse()
    root = tmp_path / "tier2"
    with mounted_daemon(tmp_path, config(root)) as d:
        assert cli(d, "create", "out").returncode == 0
        r = cli(d, "txn", "begin", "out")
        assert r.returncode == 0, r.stderr
        txn = r.stdout.decode().strip()
        assert txn.startswith(".txn/")
        assert cli(d, "txn", "append", txn, stdin=b"a\nb\n").returncode == 0
        # Not visible before the commit: not in ls, not in the mount, parent empty.
        assert b".txn" not in cli(d, "ls").stdout
        assert not (d.mnt / ".txn").exists()
        assert (d.mnt / "out").read_bytes() == b""
        r = cli(d, "txn", "commit", txn)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["segment"] == "out"
        # The mount shows growth within fuse.attr_timeout, all of it at once.
        wait_for(lambda: (d.mnt / "out").read_bytes() == b"a\nb\n", 20, "the commit")
        again = cli(d, "txn", "commit", txn)  # answered from the record of finished ones
        assert again.returncode == 0 and json.loads(again.stdout) == json.loads(r.stdout)
        r = cli(d, "txn", "begin", "out")
        txn2 = r.stdout.decode().strip()
        assert cli(d, "txn", "append", txn2, stdin=b"never\n").returncode == 0
        assert cli(d, "txn", "abort", txn2).returncode == 0
        assert (d.mnt / "out").read_bytes() == b"a\nb\n"
        # Bad input: a clear error, nothing changed.
        r = cli(d, "stream", "create", "s", "--roll-size", "lots")
        assert r.returncode != 0 and b"--roll-size" in r.stderr
        r = cli(d, "stream", "create", "out")
        assert r.returncode == 11 and b"exists" in r.stderr
        r = cli(d, "create", ".txn/mine")
        assert r.returncode == 16
        r = cli(d, "txn", "commit", "out")
        assert r.returncode == 40 and b"not a transaction" in r.stderr
        assert cli(d, "stream", "create", "s", "--roll-age", "1h").returncode == 0
        r = cli(d, "stream", "set", "s", "--roll-age", "default", "--retain-age", "7d")
        doc = json.loads(r.stdout)
        assert doc["own"] == {"retain_age_ms": 7 * 86_400_000}
        assert cli(d, "append", "s", stdin=b"1\n2\n").returncode == 0
        doc = json.loads(cli(d, "stream", "roll", "s").stdout)
        assert doc["segments"] == ["s/000000000001"]
        assert cli(d, "append", "s", stdin=b"3\n").returncode == 0
        lines = cli(d, "stream", "list").stdout.splitlines()
        assert [json.loads(x)["segments"] for x in lines] == [["s/000000000001", "s/000000000002"]]
        assert cli(d, "stream", "delete", "s").returncode == 0
        assert not (d.mnt / "s").exists() or os.listdir(d.mnt / "s") == []
        fsck_clean(d)


MERGE_STEPS = ["txn_commit_sealed", "txn_commit_merged", "before_merge_completed",
               "after_merge_completed"]  # fmt: skip


@pytest.mark.parametrize("failpoint", MERGE_STEPS)
def test_a_crash_at_each_step_of_a_merge_recovers_to_merged_or_not(
    tmp_path: pathlib.Path, failpoint: str
) -> None:
    root = tmp_path / "tier2"
    cfg = config(root)
    rng = random.Random(failpoint)
    before = rng.randbytes(40 * KiB)
    txn_bytes = rng.randbytes(50 * KiB)
    crashing = Daemon(
        tmp_path / "node", cfg, env={"SEGMENT_GATEWAY_FAILPOINTS": f"{failpoint}=kill"}
    )
    crashing.start()
    try:
        with SyncClient(crashing.address) as c:
            c.create("p")
            c.append("p", before)
            t = c.begin_transaction("p")
            for i in range(0, len(txn_bytes), 10 * KiB):
                c.append(t.name, txn_bytes[i : i + 10 * KiB])
            if failpoint in ("before_merge_completed", "after_merge_completed"):
                c.flush()  # both in Tier 2 first: the storage merge is next
            try:
                c.commit_transaction(t.name)
                c.flush()
            except Exception:
                pass  # the daemon died under the request
        crashing.proc.wait(timeout=30)  # type: ignore[union-attr]
        assert crashing.proc.returncode == -9  # type: ignore[union-attr]
    finally:
        crashing.kill()
    d = Daemon(tmp_path / "node", cfg, port=crashing.port)
    d.start()
    try:
        # fsck knows whichever shape the crash left: not merged, merged in the
        # journal only (the target reads the source's chunks), or merged in Tier 2.
        fsck_clean(d)
        with SyncClient(d.address) as c:
            got = c.read("p", 0, 1 << 20).data
            if got == before:
                # Not merged: the transaction is whole and can still commit.
                c.commit_transaction(t.name)
            else:
                assert got == before + txn_bytes
                with pytest.raises(SegmentNotFound):
                    c.info(t.name)
            assert c.read("p", 0, 1 << 20).data == before + txn_bytes
            c.flush()
            info = c.info("p")
            assert info.storage_length == info.length == len(before) + len(txn_bytes)
            assert [s.name for s in c.list()] == ["p"]
        fsck_clean(d)
        d.stop()
        # And from Tier 2 alone (chunks re-referenced, not copied).
        d.start()
        with SyncClient(d.address) as c:
            assert c.read("p", 0, 1 << 20).data == before + txn_bytes
    finally:
        d.kill()


def test_a_writer_and_open_transaction_exactly_once(tmp_path: pathlib.Path) -> None:
    import trio

    from gateway.client.writer import open_transaction

    root = tmp_path / "tier2"
    d = Daemon(tmp_path / "node", config(root))
    d.start()
    try:
        with SyncClient(d.address) as c:
            c.create_stream("orders", {"roll_size": 512})

        async def main() -> list[str]:
            landed = []
            for batch in range(5):
                async with open_transaction(d.address, "orders", codec="lines") as txn:
                    for i in range(100):
                        await txn.write(b"b%d-%03d" % (batch, i))
                assert txn.committed is not None
                landed.append(txn.committed.segment)
            with pytest.raises(RuntimeError):
                async with open_transaction(d.address, "orders", codec="lines") as txn:
                    await txn.write(b"never")
                    raise RuntimeError("the unit of work failed")
            return landed

        landed = trio.run(main)
        assert len(set(landed)) == 5  # each commit rolled the 512-byte segment
        with SyncClient(d.address) as c:
            segs = c.stream("orders").segments
            data = b"".join(c.read(s.name, 0, 1 << 20).data for s in segs)
            assert b"never" not in data
            expect = b"".join(b"b%d-%03d\n" % (b, i) for b in range(5) for i in range(100))
            assert data == expect
            assert sum(s.event_count for s in segs) == 500
            assert c.list(".txn") == []
    finally:
        d.kill()
