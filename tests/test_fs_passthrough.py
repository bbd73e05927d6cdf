"""FUSE passthrough of sealed segments (fs/passthrough.py, cache/segment_files.py).

One daemon for the module, its Tier 2 a bucket on the session's SeaweedFS,
its mount real. What a reader sees is checked against what was appended;
whether the daemon served a read is checked on its own counters
(``fuse_ops_total{operation="read"}``, ``fuse_passthrough_opens_total``).
Reads through passthrough go from the kernel to a local file and cannot
hang on the daemon, so they are made in this process. A segment gets its
file once the daemon has served all of it, so each case reads a segment
in full first.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import scrape
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KiB = 1024
MiB = 1024 * KiB
READS = 'segment_gateway_fuse_ops_total{operation="read"}'
PASSTHROUGH_OPENS = "segment_gateway_fuse_passthrough_opens_total"
REQUESTED = "segment_gateway_fuse_segment_files_requested_total"
TIER2_READS = 'segment_gateway_tier2_requests_total{operation="read"}'

CONFIG = """
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
flush_size = "256 KiB"
max_chunk_size = "1 MiB"
flush_interval = "60s"
[fuse]
passthrough = {passthrough}
passthrough_budget = "12 MiB"
"""


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, seaweedfs: EmbeddedS3
) -> Iterator[MountedDaemon]:
    """A mounted daemon with passthrough on and a 12 MiB budget for segment files."""
    storage = S3Storage(
        f"test-{uuid.uuid4().hex[:16]}",
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    storage.create_bucket_if_missing()
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    config = CONFIG.replace("{bucket}", storage.bucket).replace(
        "{endpoint}", seaweedfs.endpoint_url
    )
    with mounted_daemon(
        tmp_path_factory.mktemp("passthrough"), config.replace("{passthrough}", "true"), env
    ) as d:
        d.config_template = config  # type: ignore[attr-defined]
        yield d


def files_dir(d: MountedDaemon) -> pathlib.Path:
    return d.data_dir / "segment-files"


def segment_files(d: MountedDaemon) -> dict[int, str]:
    """Segment id -> file name of the finished segment files."""
    return {
        int(p.name.split(".")[0]): p.name
        for p in files_dir(d).iterdir()
        if not p.name.startswith(".")
    }


def counters(d: MountedDaemon) -> tuple[float, float]:
    """(reads the daemon served, passthrough opens), once every file closed here
    is released there too (the kernel sends RELEASE after close returns, and an
    open the daemon still counts holds its inode's io mode)."""
    wait_for(
        lambda: scrape(d.metrics_port)["segment_gateway_fuse_open_files"] == held(d),
        10,
        "releases",
    )
    m = scrape(d.metrics_port)
    return m.get(READS, 0.0), m.get(PASSTHROUGH_OPENS, 0.0)


def held(d: MountedDaemon) -> int:
    """Files of the mount this process has open."""
    fds = pathlib.Path("/proc/self/fd")
    mnt = str(d.mnt) + "/"
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).startswith(mnt))


def read_file(path: pathlib.Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def sealed(c: SyncClient, name: str, size: int, rng: random.Random) -> bytes:
    c.create(name)
    data = rng.randbytes(size)
    for i in range(0, size, MiB):
        c.append(name, data[i : i + MiB])
    c.seal(name)
    return data


def wait_for_file(d: MountedDaemon, segment_id: int) -> None:
    wait_for(lambda: segment_id in segment_files(d), 30, f"segment file of {segment_id}")


def settled_tier2_reads(d: MountedDaemon) -> float:
    """Tier-2 reads, once none was made for a second (read-ahead lands after a read)."""
    seen = [scrape(d.metrics_port).get(TIER2_READS, 0.0), time.monotonic()]

    def quiet() -> bool:
        now = scrape(d.metrics_port).get(TIER2_READS, 0.0)
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
        return time.monotonic() - seen[1] >= 1.0

    wait_for(quiet, 30, "Tier-2 reads to stop", interval=0.1)
    return seen[0]


def test_sealed_segments_read_by_the_kernel_byte_exact(daemon: MountedDaemon) -> None:
    """Large and small, from the journal, then from Tier 2 with the cache gone: no reads."""
    rng = random.Random(34)
    with SyncClient(daemon.address) as c:
        expected = {"pt/large": sealed(c, "pt/large", 8 * MiB + 17, rng)}
        expected["pt/small"] = sealed(c, "pt/small", 5, rng)
        ids = {name: c.info(name).id for name in expected}
    for name, data in expected.items():
        assert read_file(daemon.mnt / name) == data  # the daemon's path; the file follows
        wait_for_file(daemon, ids[name])
    reads, opens = counters(daemon)
    for name, data in expected.items():
        assert read_file(daemon.mnt / name) == data
        assert (files_dir(daemon) / segment_files(daemon)[ids[name]]).read_bytes() == data
    assert counters(daemon) == (reads, opens + 2), "passthrough opens, and not one read"

    # All in Tier 2, the cache and the files gone: the files come from Tier 2.
    with SyncClient(daemon.address) as c:
        c.flush()
        assert all(c.info(n).storage_length == len(d) for n, d in expected.items())
    assert daemon.stop() == 0
    shutil.rmtree(daemon.data_dir / "cache")
    shutil.rmtree(files_dir(daemon))
    daemon.start(timeout=60)
    for name, data in expected.items():
        assert read_file(daemon.mnt / name) == data
        wait_for_file(daemon, ids[name])
    reads, opens = counters(daemon)
    for name, data in expected.items():
        assert read_file(daemon.mnt / name) == data
    assert counters(daemon) == (reads, opens + 2)


def test_truncate_and_delete_under_a_passthrough_reader(daemon: MountedDaemon) -> None:
    """Truncated: open readers and new opens read zeros below the start (the file is
    punched); deleted: an open reader keeps its bytes, as with a local file."""
    rng = random.Random(35)
    with SyncClient(daemon.address) as c:
        data = sealed(c, "cut/a", 3 * MiB, rng)
        gone = sealed(c, "cut/b", 1 * MiB, rng)
        ids = [c.info("cut/a").id, c.info("cut/b").id]
        for name in ("cut/a", "cut/b"):
            read_file(daemon.mnt / name)
        for sid in ids:
            wait_for_file(daemon, sid)
        _, opens = counters(daemon)
        held_a = os.open(daemon.mnt / "cut/a", os.O_RDONLY)
        held_b = os.open(daemon.mnt / "cut/b", os.O_RDONLY)
        try:
            assert counters(daemon)[1] == opens + 2
            c.truncate("cut/a", 1 * MiB + 3)
            c.delete("cut/b")
            now = bytes(MiB + 3) + data[MiB + 3 :]
            assert os.pread(held_a, 4 * MiB, 0) == now
            assert ids[1] not in segment_files(daemon)
            assert os.pread(held_b, 2 * MiB, 0) == gone
            # A new open shares the held backing file.
            reads, opens = counters(daemon)
            assert read_file(daemon.mnt / "cut/a") == now
            assert counters(daemon) == (reads, opens + 1)
            assert not (daemon.mnt / "cut/b").exists()
        finally:
            os.close(held_a)
            os.close(held_b)
    name = segment_files(daemon)[ids[0]]
    assert name.split(".")[2] == str(MiB + 3), "named for its new start"
    assert (files_dir(daemon) / name).read_bytes() == now
    reads, opens = counters(daemon)
    assert read_file(daemon.mnt / "cut/a") == now
    assert counters(daemon) == (reads, opens + 1)


def test_budget_evicts_the_least_recently_opened(daemon: MountedDaemon) -> None:
    """12 MiB: a 6 MiB file and a 7 MiB one do not fit together; a 13 MiB one never gets one."""
    rng = random.Random(36)
    with SyncClient(daemon.address) as c:
        first = sealed(c, "budget/first", 6 * MiB, rng)
        second = sealed(c, "budget/second", 7 * MiB, rng)
        huge = sealed(c, "budget/huge", 13 * MiB, rng)
        ids = [c.info(n).id for n in ("budget/first", "budget/second", "budget/huge")]
    assert read_file(daemon.mnt / "budget/first") == first
    wait_for_file(daemon, ids[0])
    assert read_file(daemon.mnt / "budget/second") == second
    wait_for_file(daemon, ids[1])
    assert ids[0] not in segment_files(daemon), "the older file went to make room"
    assert read_file(daemon.mnt / "budget/huge") == huge
    assert ids[2] not in segment_files(daemon)
    sizes = sum(p.stat().st_size for p in files_dir(daemon).iterdir())
    assert sizes <= 12 * MiB
    _, opens = counters(daemon)
    # Without its file: the daemon's path (its pages may still be in the page cache).
    assert read_file(daemon.mnt / "budget/first") == first
    assert counters(daemon)[1] == opens


def test_active_segments_and_cached_opens_keep_the_daemon_path(daemon: MountedDaemon) -> None:
    """An active segment, and a sealed one still open in cached mode, are read by the daemon."""
    rng = random.Random(37)
    data = rng.randbytes(2 * MiB)
    path = daemon.mnt / "mode/s"
    with SyncClient(daemon.address) as c:
        c.create("mode/s")
        c.append("mode/s", data)
        sid = c.info("mode/s").id
        reads, opens = counters(daemon)
        active = os.open(path, os.O_RDONLY)  # direct I/O: no io mode
        try:
            assert os.pread(active, 4 * MiB, 0) == data
            assert counters(daemon)[0] > reads and sid not in segment_files(daemon)
            c.seal("mode/s")
            wait_for(lambda: os.stat(path).st_size == len(data), 10, "the sealed size")
            cached = os.open(path, os.O_RDONLY)  # the first open of it sealed: cached
            try:
                assert os.pread(cached, 4 * MiB, 0) == data
                wait_for_file(daemon, sid)
                # A cached open holds the inode: this one must join it, not fail.
                assert read_file(path) == data
                assert counters(daemon)[1] == opens
            finally:
                os.close(cached)
        finally:
            os.close(active)
    reads, opens = counters(daemon)
    assert read_file(path) == data
    assert counters(daemon) == (reads, opens + 1)


def test_restart_reuses_files_and_passthrough_off_is_todays_path(daemon: MountedDaemon) -> None:
    """Files survive a restart (stale and temporary ones do not); ``passthrough = false``."""
    rng = random.Random(38)
    with SyncClient(daemon.address) as c:
        data = sealed(c, "restart/a", 2 * MiB, rng)
        sid = c.info("restart/a").id
    read_file(daemon.mnt / "restart/a")
    wait_for_file(daemon, sid)
    kept = segment_files(daemon)[sid]
    assert daemon.stop() == 0
    (files_dir(daemon) / ".tmp.999.1.0.5.1").write_bytes(b"torn")
    (files_dir(daemon) / "999999.1.0.5").write_bytes(b"stale")  # no such segment
    daemon.start(timeout=60)
    assert sorted(p.name for p in files_dir(daemon).iterdir()) == sorted(
        segment_files(daemon).values()
    )
    assert segment_files(daemon)[sid] == kept and 999999 not in segment_files(daemon)
    reads, opens = counters(daemon)
    assert read_file(daemon.mnt / "restart/a") == data
    assert counters(daemon) == (reads, opens + 1), "the file from before, at the first open"

    assert daemon.stop() == 0
    template: str = daemon.config_template  # type: ignore[attr-defined]
    daemon.config_path.write_text(template.replace("{passthrough}", "false"))
    try:
        daemon.start(timeout=60)
        reads, opens = counters(daemon)
        assert read_file(daemon.mnt / "restart/a") == data
        reads_after, opens_after = counters(daemon)
        assert reads_after > reads and opens_after == opens == 0
    finally:
        assert daemon.stop() == 0
        daemon.config_path.write_text(template.replace("{passthrough}", "true"))
        daemon.start(timeout=60)


def test_a_partial_read_makes_no_file_and_a_full_one_copies_from_the_cache(
    daemon: MountedDaemon,
) -> None:
    """4 KiB of a 10 MiB sealed segment only in Tier 2: no segment file is asked for and
    nothing more is fetched; once the rest is read, the file is made from the cache
    (no Tier-2 read) and the next open is a passthrough one."""
    rng = random.Random(39)
    path = daemon.mnt / "partial/a"
    with SyncClient(daemon.address) as c:
        data = sealed(c, "partial/a", 10 * MiB, rng)  # ten 1 MiB chunks
        sid = c.info("partial/a").id
        c.flush()
        assert c.info("partial/a").storage_length == len(data)
    assert daemon.stop() == 0
    shutil.rmtree(daemon.data_dir / "cache")
    daemon.start(timeout=60)
    before = settled_tier2_reads(daemon)
    with open(path, "rb", buffering=0) as f:
        assert f.read(4 * KiB) == data[: 4 * KiB]
    counters(daemon)
    fetched = settled_tier2_reads(daemon) - before
    assert 1 <= fetched <= 4, "what the read and its read-ahead need, not the segment"
    assert scrape(daemon.metrics_port).get(REQUESTED, 0.0) == 0
    assert sid not in segment_files(daemon)

    assert read_file(path) == data  # the rest through the daemon: now it asks for the file
    wait_for_file(daemon, sid)
    total = settled_tier2_reads(daemon) - before
    # A copy through Tier 2 would fetch all ten chunks again.
    assert total <= len(data) // MiB + fetched, "each chunk fetched once: the copy read the cache"
    assert scrape(daemon.metrics_port)[REQUESTED] == 1
    assert (files_dir(daemon) / segment_files(daemon)[sid]).read_bytes() == data
    reads, opens = counters(daemon)
    assert read_file(path) == data
    assert counters(daemon) == (reads, opens + 1)
