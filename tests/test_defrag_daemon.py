"""The storage optimizer in a real daemon over S3 (SeaweedFS): a trickle segment's many small
objects merged while it is read through the protocol and the mount, reloaded on, crashed at
each step, and fsck --deep clean afterwards."""

from __future__ import annotations

import pathlib
import random
import shutil
import signal

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.storage import object_keys as names
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import Cluster
from tests.helpers.daemon import Daemon, scrape
from tests.helpers.mount import MountedDaemon, require_fuse, run
from tests.helpers.wait import wait_for
from tests.test_fsck import assert_clean, fsck

pytestmark = pytest.mark.slow

KiB = 1024
NODE = "node-1"

CONFIG = """
[node]
id = "{node}"
data_dir = "{data_dir}"
[tier2]
url = "s3://{bucket}/p"
endpoint_url = "{endpoint}"
flush_size = "64 KiB"
flush_interval = "1h"
max_chunk_size = "64 KiB"
snapshot_interval = "0s"
stop_flush_timeout = "5s"
gc_interval = "300ms"
gc_grace = "{grace}"
defrag = {defrag}
defrag_min_chunks = 4
defrag_interval = "100ms"
"""


def config_text(
    data_dir: pathlib.Path, s3: EmbeddedS3, bucket: str, defrag: bool = True, grace: str = "0s"
) -> str:
    return CONFIG.format(
        node=NODE,
        data_dir=data_dir,
        bucket=bucket,
        endpoint=s3.endpoint_url,
        defrag="true" if defrag else "false",
        grace=grace,
    )


def s3_env(s3: EmbeddedS3) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}


def objects(storage: S3Storage) -> set[str]:
    return {o.key for o in storage.list(f"p/{names.chunks_prefix(NODE)}")}


def read_all(c: SyncClient, name: str) -> bytes:
    length = c.info(name).length
    out = b""
    while len(out) < length:
        piece = c.read(name, len(out), length - len(out)).data
        assert piece, f"empty read at {len(out)} < {length}"
        out += piece
    return out


def trickle(c: SyncClient, name: str, flushes: int, rng: random.Random, data: bytes = b"") -> bytes:
    """``data`` (the segment so far) and ``flushes`` small appends, each flushed at once
    (one new object each on S3)."""
    for _ in range(flushes):
        piece = rng.randbytes(rng.randrange(1000, 2000))
        c.append(name, piece)
        c.flush(name)
        data += piece
        # Every byte reads back while the optimizer works on the segment.
        assert read_all(c, name) == data
    return data


@pytest.mark.timeout(120)
def test_trickle_segment_is_defragmented_while_read(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage
) -> None:
    """60 flushes make 60 objects; reloaded with defrag on they become about size /
    max_chunk_size + the active tail, every byte readable through the protocol and
    the mount (cache wiped), and fsck --deep finds nothing."""
    require_fuse()
    bucket = s3_storage.bucket
    daemon = MountedDaemon(
        tmp_path / "node",
        tmp_path / "mnt",
        config_text=config_text(tmp_path / "node", seaweedfs, bucket, defrag=False, grace="1s"),
        env=s3_env(seaweedfs),
    )
    rng = random.Random(33)
    try:
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            c.create("slow/s")
            data = trickle(c, "slow/s", 60, rng)
            before = len(objects(s3_storage))
            assert before == 60 == c.info("slow/s").chunk_count
            # Defragmentation switched on by a reload (SIGHUP).
            daemon.config_path.write_text(
                config_text(tmp_path / "node", seaweedfs, bucket, grace="1s")
            )
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "reloaded: tier2.defrag" in daemon.log(), 20, "the reload")
            # Read through the protocol and the mount while it works.
            want = -(-len(data) // (64 * KiB)) + 2

            def merged() -> bool:
                assert read_all(c, "slow/s") == data
                return c.info("slow/s").chunk_count <= want

            wait_for(merged, 30, "the chunks merged", interval=0.05)
            assert run("cat", daemon.mnt / "slow/s").stdout == data
            # More trickle after the merge: still exact.
            data = trickle(c, "slow/s", 5, rng, data)
            # The replaced objects go once GC's grace (1 s) is over.
            wait_for(
                lambda: len(objects(s3_storage)) == c.info("slow/s").chunk_count,
                20,
                "the replaced objects deleted",
            )
            after = len(objects(s3_storage))
            print(f"objects for {len(data)} bytes: {before} before, {after} after")
            m = scrape(daemon.metrics_port)
            p = "segment_gateway_defrag_"
            assert m[p + "runs_total"] >= 1
            assert m[p + "chunks_replaced_total"] >= before - after
            # Sources under 5 MiB: read and uploaded again, none copied inside S3.
            assert m[p + 'bytes_total{how="reuploaded"}'] >= len(data) // 2
            assert m[p + 'bytes_total{how="copied"}'] == 0
            assert m[p + "failures_total"] == 0
            assert after <= -(-len(data) // (64 * KiB)) + 1 + 5
        assert daemon.stop() == 0, daemon.log()
        # Cold: the cache wiped, every byte from the merged objects.
        shutil.rmtree(daemon.data_dir / "cache")
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            assert read_all(c, "slow/s") == data
        assert run("cat", daemon.mnt / "slow/s").stdout == data
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.teardown()
    assert_clean(fsck(daemon.config_path, "--deep", env=s3_env(seaweedfs)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("failpoint", ["after_defrag_concat", "after_chunks_replaced"])
def test_crash_during_a_merge_loses_nothing_and_gc_cleans_up(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage, failpoint: str
) -> None:
    """Killed after the merged object exists (before the swap), or after the swap (before
    the replaced objects are deleted): after a restart every byte reads back, GC deletes
    the leftovers, and fsck --deep finds nothing."""
    bucket = s3_storage.bucket
    text = config_text(tmp_path / "node", seaweedfs, bucket, defrag=False)
    env = s3_env(seaweedfs)
    crashing = Daemon(
        tmp_path / "node", text, env={**env, "SEGMENT_GATEWAY_FAILPOINTS": f"{failpoint}=kill"}
    )
    rng = random.Random(7)
    try:
        crashing.start(timeout=60)
        with SyncClient(crashing.address) as c:
            c.create("s")
            data = trickle(c, "s", 8, rng)
        crashing.config_path.write_text(config_text(tmp_path / "node", seaweedfs, bucket))
        assert crashing.proc is not None
        crashing.proc.send_signal(signal.SIGHUP)
        crashing.proc.wait(timeout=30)
        assert crashing.proc.returncode == -9, crashing.log()
    finally:
        crashing.kill()
    left = objects(s3_storage)
    assert len(left) == 9  # 8 flushed chunks and the merged one

    # Restarted without the failpoint and without defrag: only recovery and GC act.
    daemon = Daemon(tmp_path / "node", text, port=crashing.port, env=env)
    daemon.config_path.write_text(text)
    try:
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            assert read_all(c, "s") == data
            chunks = c.info("s").chunk_count
            assert chunks == (8 if failpoint == "after_defrag_concat" else 2)
            # GC (every 300 ms, no grace) deletes the orphan or the replaced objects.
            wait_for(lambda: len(objects(s3_storage)) == chunks, 20, "the leftovers deleted")
            assert read_all(c, "s") == data
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()
    assert_clean(fsck(daemon.config_path, "--deep", env=env))


@pytest.mark.timeout(180)
def test_another_nodes_mount_reads_every_byte_while_the_owner_defragments(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> None:
    """node-b trickles and merges; node-a's mount reads the segment throughout (the old
    objects outlive its stale chunk list by GC's grace), then again with its cache wiped."""
    require_fuse()
    cluster = Cluster(tmp_path, seaweedfs, nodes=("node-a", "node-b"))
    owner = cluster.daemons["node-b"]
    owner.config_path.write_text(
        owner.config_path.read_text().replace(
            "[tier2]\n",
            '[tier2]\nflush_size = "64 KiB"\nmax_chunk_size = "64 KiB"\ngc_grace = "2s"\n'
            'gc_interval = "300ms"\ndefrag_min_chunks = 4\ndefrag_interval = "100ms"\n',
        )
    )
    reader = cluster.daemons["node-a"]
    name = "node-b/slow"
    path = reader.mnt / name
    rng = random.Random(3)
    try:
        cluster.start()
        with cluster.client("node-b") as c:
            c.create(name)
            data = b""
            for _ in range(5):
                data = trickle(c, name, 6, rng, data)
                # The remote view catches up with every byte, whatever chunk list it holds.
                size = len(data)
                wait_for(
                    lambda: path.exists() and path.stat().st_size == size,
                    10,
                    "node-a's view of the segment",
                )
                assert run("cat", path).stdout == data
            # Sealed: a final merge packs it into chunks of max_chunk_size (64 KiB).
            c.seal(name)
            c.flush(name)
            wait_for(lambda: c.info(name).chunk_count == 1, 20, "the owner's final merge")
            assert run("cat", path).stdout == data
            merged = c.info(name).chunk_count
        # Cold: node-a reads the merged objects with its cache wiped.
        reader.stop()
        shutil.rmtree(reader.data_dir / "cache")
        reader.start(timeout=60)
        wait_for(lambda: path.exists() and path.stat().st_size == len(data), 10, "node-a's view")
        assert run("cat", path).stdout == data
        assert merged == 1
    finally:
        cluster.teardown()


@pytest.mark.timeout(150)
def test_defrag_concurrency_is_reloaded_and_every_segment_merged(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage
) -> None:
    """Six trickle segments; a reload turns defrag on with ``defrag_concurrency`` 3 (applied
    at once, not at the next start): each segment is merged, every byte reads back through
    the protocol and the mount, and fsck --deep finds nothing."""
    require_fuse()
    bucket = s3_storage.bucket
    node = tmp_path / "node"
    daemon = MountedDaemon(
        node,
        tmp_path / "mnt",
        config_text=config_text(node, seaweedfs, bucket, defrag=False),
        env=s3_env(seaweedfs),
    )
    rng = random.Random(34)
    segments = [f"slow/s{i}" for i in range(6)]
    try:
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            data = {}
            for name in segments:
                c.create(name)
                data[name] = trickle(c, name, 9, rng)
            assert len(objects(s3_storage)) == 6 * 9
            daemon.config_path.write_text(
                config_text(node, seaweedfs, bucket) + "defrag_concurrency = 3\n"
            )
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "tier2.defrag_concurrency" in daemon.log(), 20, "the reload")
            assert "take effect at the next start" not in daemon.log()
            # Nine chunks of 1-2 KB: the eight before the tail merged into one.
            wait_for(lambda: all(c.info(n).chunk_count == 2 for n in segments), 30, "the merges")
            for name in segments:
                assert read_all(c, name) == data[name]
                assert run("cat", daemon.mnt / name).stdout == data[name]
            wait_for(lambda: len(objects(s3_storage)) == 6 * 2, 20, "the replaced deleted")
            m = scrape(daemon.metrics_port)
            assert m["segment_gateway_defrag_runs_total"] == 6
            assert m["segment_gateway_defrag_failures_total"] == 0
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.teardown()
    assert_clean(fsck(daemon.config_path, "--deep", env=s3_env(seaweedfs)))
