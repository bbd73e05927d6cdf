"""The FUSE mount, through real mounts of a real daemon on a real SeaweedFS.

Every access to the mount that could block runs either in a subprocess with
a timeout or against a daemon that the fixture tears down by aborting the
FUSE connection: a broken mount fails a test, never hangs the suite.
"""

from __future__ import annotations

import errno
import mmap
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import ROOT, scrape
from tests.helpers.mount import MountedDaemon, mount_entry, mounted_daemon, require_fuse, run
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB

S3_CONFIG = """
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
flush_size = "256 KiB"
max_chunk_size = "1 MiB"
flush_interval = "60s"
[fuse]
owner = "1234"
group = "4321"
"""


@pytest.fixture
def s3_daemon(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage
) -> Iterator[MountedDaemon]:
    """A mounted daemon whose Tier 2 is a fresh bucket on the session's SeaweedFS."""
    config = S3_CONFIG.format(bucket=s3_storage.bucket, endpoint=seaweedfs.endpoint_url)
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    with mounted_daemon(tmp_path, config, env) as daemon:
        yield daemon


def protocol_bytes(c: SyncClient, name: str) -> bytes:
    """The segment as a file shows it, read through the protocol: zeros below the start."""
    info = c.info(name)
    out = bytearray(info.start_offset)
    offset = info.start_offset
    while offset < info.length:
        piece = c.read(name, offset, 4 * MiB).data
        assert piece, f"{name}: empty read at {offset} < {info.length}"
        out += piece
        offset += len(piece)
    return bytes(out)


def append_random(c: SyncClient, name: str, size: int, rng: random.Random) -> bytes:
    """Create ``name`` and append ``size`` random bytes in random-sized pieces."""
    c.create(name)
    data = rng.randbytes(size)
    i = 0
    while i < size:
        n = rng.choice([1, 100, 4 * KiB, 60 * KiB, 300 * KiB, 1 * MiB])
        c.append(name, data[i : i + n])
        i += n
    return data


def check_all(mnt: pathlib.Path, c: SyncClient, expected: dict[str, bytes]) -> None:
    for name, data in expected.items():
        # In a subprocess: `cat` is what users run, and it cannot hang this test.
        through_mount = run("cat", mnt / name, timeout=60).stdout
        assert len(through_mount) == len(data), name
        assert through_mount == data, f"{name}: mount bytes differ from what was appended"
        assert through_mount == protocol_bytes(c, name), name


@pytest.mark.timeout(240)
def test_mount_shows_every_segment_byte_exact(s3_daemon: MountedDaemon) -> None:
    """Active, sealed, truncated, offloaded with the cache wiped, and after a restart."""
    mnt = s3_daemon.mnt
    rng = random.Random(61)
    expected: dict[str, bytes] = {}
    with SyncClient(s3_daemon.address) as c:
        expected["a/active"] = append_random(c, "a/active", 3 * MiB + 17, rng)
        expected["a/sealed"] = append_random(c, "a/sealed", 2 * MiB + 5, rng)
        c.seal("a/sealed")
        data = append_random(c, "b/c/truncated", 3 * MiB + 99, rng)
        c.truncate("b/c/truncated", 1 * MiB + 12345)
        expected["b/c/truncated"] = bytes(1 * MiB + 12345) + data[1 * MiB + 12345 :]
        expected["top"] = append_random(c, "top", 1, rng)
        expected["empty"] = b""
        c.create("empty")
        check_all(mnt, c, expected)

        # Everything into Tier 2; then the cache goes and the daemon restarts.
        c.flush()
        for name in expected:
            info = c.info(name)
            assert info.storage_length == info.length, name
        assert c.info("a/active").chunk_count >= 3
    assert s3_daemon.stop() == 0
    assert mount_entry(mnt) is None, "a clean stop unmounts"
    shutil.rmtree(s3_daemon.data_dir / "cache")
    s3_daemon.start(timeout=60)
    with SyncClient(s3_daemon.address) as c:
        check_all(mnt, c, expected)
        # The active segment keeps growing after the restart.
        more = rng.randbytes(200 * KiB)
        c.append("a/active", more)
        expected["a/active"] += more
        # The kernel keeps an active file's size for fuse.active_timeout.
        wait_for_size(mnt / "a/active", len(expected["a/active"]))
        check_all(mnt, c, expected)


def test_posix_tools(s3_daemon: MountedDaemon) -> None:
    """ls -lR, stat, cat, dd with odd block sizes, tail -c, getfattr, find."""
    mnt = s3_daemon.mnt
    rng = random.Random(7)
    with SyncClient(s3_daemon.address) as c:
        data = append_random(c, "logs/app/0", 777_777, rng)
        c.seal("logs/app/0")
        c.create("logs/app/1")
        c.append("logs/app/1", b"line 1\nline 2\n")
        c.create("logs/other")
        info = c.info("logs/app/0")

    listing = run("ls", "-lR", mnt).stdout.decode()
    assert "logs:" in listing.replace(str(mnt) + "/", "")
    assert "-r--r--r--" in listing and "dr-xr-xr-x" in listing
    assert " 777777 " in listing

    fmt = "%s|%a|%F|%h|%b|%B|%i"
    out = run("stat", "-c", fmt, mnt / "logs/app/0").stdout.decode().strip().split("|")
    assert out[:4] == ["777777", "444", "regular file", "1"]
    assert int(out[4]) * int(out[5]) >= 777_777  # st_blocks consistent with the size
    assert int(out[6]) == (1 << 40) + info.id
    out = run("stat", "-c", "%a|%F|%u|%g", mnt / "logs/app").stdout.decode().strip().split("|")
    assert out == ["555", "directory", "1234", "4321"]  # owner from fuse.owner / fuse.group
    out = run("stat", "-c", "%u|%g", mnt / "logs/app/0").stdout.decode().strip().split("|")
    assert out == ["1234", "4321"]

    assert run("cat", mnt / "logs/app/1").stdout == b"line 1\nline 2\n"
    for bs in ("1", "4095", "65537", "1000000"):
        r = run("dd", f"if={mnt / 'logs/app/0'}", "of=/dev/stdout", f"bs={bs}", "status=none")
        assert r.stdout == data, f"dd bs={bs}"
    r = run("dd", f"if={mnt / 'logs/app/0'}", "bs=4093", "skip=17", "count=3", "status=none")
    assert r.stdout == data[17 * 4093 : 20 * 4093]
    assert run("tail", "-c", "1000", mnt / "logs/app/0").stdout == data[-1000:]
    assert run("tail", "-n", "1", mnt / "logs/app/1").stdout == b"line 2\n"

    r = run("getfattr", "-d", "-m", "user.segment", mnt / "logs/app/0").stdout.decode()
    assert 'user.segment.length="777777"' in r
    assert 'user.segment.sealed="1"' in r
    assert f'user.segment.event_count="{info.event_count}"' in r
    r = run("getfattr", "-n", "user.segment.sealed", "--only-values", mnt / "logs/app/1")
    assert r.stdout == b"0"
    r = run("getfattr", "-n", "user.nope", mnt / "logs/app/1", check=False)
    assert r.returncode != 0 and b"No such attribute" in r.stderr

    found = run("find", mnt, "-type", "f").stdout.decode().split()
    assert sorted(p.removeprefix(str(mnt) + "/") for p in found) == [
        "logs/app/0",
        "logs/app/1",
        "logs/other",
    ]
    found = run("find", mnt, "-type", "d").stdout.decode().split()
    assert len(found) == 3  # the root, logs, logs/app

    # docs/OPERATIONS.md, "df and disk alerts": the bytes of all segments,
    # none free (a read-only filesystem); an inode per segment and directory.
    df = run("df", "-B1", "--output=size,used,avail,pcent", mnt).stdout.decode().split()
    size = sum(-(-n // 4096) * 4096 for n in (777_777, 14, 0))
    assert df[-4:] == [str(size), str(size), "0", "100%"], df
    df = run("df", "--output=itotal,iused,iavail", mnt).stdout.decode().split()
    assert df[-3:] == ["6", "6", "0"], df  # 3 segments; the root, logs, logs/app
    assert os.statvfs(mnt).f_flag & os.ST_RDONLY

    # The event-boundary index: a hidden file found by name, never listed.
    assert run("cat", mnt / "logs/app/.0.events").stdout == b"0\n"
    assert ".0.events" not in run("ls", "-a", mnt / "logs/app").stdout.decode()
    assert run("cat", mnt / "logs/app/.nope.events", check=False).returncode != 0

    opts = mount_entry(mnt)
    assert opts is not None and opts[1] == "fuse.segment-gateway"
    # The node_exporter exclusion OPERATIONS gives matches this type only.
    doc = (ROOT / "docs" / "OPERATIONS.md").read_text()
    exclude = re.search(r"fs-types-exclude='([^']+)'", doc)
    assert exclude is not None
    assert re.fullmatch(exclude.group(1), opts[1])
    assert re.fullmatch(exclude.group(1), "squashfs")
    assert not re.fullmatch(exclude.group(1), "fuse.s3fs")
    for o in ("ro", "noatime", "default_permissions"):
        assert o in opts[2].split(","), opts
    assert "allow_other" not in opts[2]


WRITE_ATTEMPTS = [
    ("sh", "-c", "echo x > {f}"),
    ("sh", "-c", "echo x >> {f}"),
    ("sh", "-c", "echo x > {d}/new"),
    ("touch", "{f}"),
    ("touch", "{d}/new"),
    ("truncate", "-s", "0", "{f}"),
    ("mkdir", "{d}/newdir"),
    ("rmdir", "{d}"),
    ("rm", "-f", "{f}"),
    ("mv", "{f}", "{d}/renamed"),
    ("ln", "{f}", "{d}/hardlink"),
    ("ln", "-s", "{f}", "{d}/symlink"),
    ("chmod", "777", "{f}"),
    ("chown", "1:1", "{f}"),
    ("setfattr", "-n", "user.segment.sealed", "-v", "0", "{f}"),
    ("setfattr", "-x", "user.segment.sealed", "{f}"),
    ("mkfifo", "{d}/fifo"),
    ("dd", "if=/dev/zero", "of={f}", "bs=1", "count=1", "conv=notrunc"),
    (sys.executable, "-c", "open({f!r}, 'r+b')"),
    (sys.executable, "-c", "import os; os.open({f!r}, os.O_WRONLY)"),
]


def test_every_write_attempt_gets_erofs(s3_daemon: MountedDaemon) -> None:
    with SyncClient(s3_daemon.address) as c:
        c.create("d/f")
        c.append("d/f", b"payload")
    f, d = s3_daemon.mnt / "d/f", s3_daemon.mnt / "d"
    problems = []
    for attempt in WRITE_ATTEMPTS:
        assert shutil.which(attempt[0]), f"{attempt[0]} is not installed"
        args = [a.format(f=str(f), d=str(d)) for a in attempt]
        r = run(*args, check=False)
        if r.returncode == 0:
            problems.append(f"{args} succeeded")
        elif b"Read-only file system" not in r.stderr:
            problems.append(f"{args}: {r.stderr!r}")
    assert not problems, "\n".join(problems)
    # Nothing changed.
    assert run("cat", f).stdout == b"payload"
    assert sorted(os.listdir(d)) == ["f"]


@pytest.mark.timeout(120)
def test_tail_follows_an_active_segment_and_seal_makes_the_size_final(
    s3_daemon: MountedDaemon,
) -> None:
    path = s3_daemon.mnt / "t/s"
    with SyncClient(s3_daemon.address) as c:
        c.create("t/s")
        c.append("t/s", b"first\n")
        tail = subprocess.Popen(
            ["tail", "-c", "+1", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            assert tail.stdout is not None
            os.set_blocking(tail.stdout.fileno(), False)
            got = bytearray()
            read_until(tail, got, b"first\n", 5)
            delays = []
            for i in range(3):
                line = f"appended {i}\n".encode()
                c.append("t/s", line)
                acked = time.monotonic()
                read_until(tail, got, got + line, 5)
                delays.append(time.monotonic() - acked)
            assert max(delays) < 2.0, f"tail -f saw appends after {delays}"
        finally:
            tail.kill()
            tail.wait(10)
            tail.stdout.close()
        length = c.info("t/s").length
        c.seal("t/s")
        assert os.stat(path).st_size == length
        assert os.getxattr(path, "user.segment.sealed") == b"1"
        with pytest.raises(Exception, match="sealed"):
            c.append("t/s", b"more")
        assert os.stat(path).st_size == length
        assert path.read_bytes() == bytes(got)


def read_until(proc: subprocess.Popen[bytes], got: bytearray, expected: bytes, s: float) -> None:
    """Add ``proc``'s output to ``got`` until it equals ``expected`` (fail after ``s`` seconds)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + s
    while bytes(got) != expected and time.monotonic() < deadline:
        try:
            chunk = os.read(proc.stdout.fileno(), 65536)
        except BlockingIOError:
            chunk = b""
        got += chunk
        if not chunk:
            time.sleep(0.02)
    assert bytes(got) == expected, f"tail printed {bytes(got)!r}, expected {expected!r}"


def fuse_read_bytes(daemon: MountedDaemon) -> float:
    """Bytes the daemon has served to the mount's reads so far."""
    return scrape(daemon.metrics_port)["segment_gateway_fuse_read_bytes_total"]


def wait_for_size(path: pathlib.Path, size: int, s: float = 5.0) -> None:
    """Until ``stat`` shows ``size`` (the kernel's copy refreshes within active_timeout)."""
    wait_for(lambda: os.stat(path).st_size == size, s, f"{path} reaching size {size}")


@pytest.mark.timeout(120)
def test_an_active_segment_is_direct_io_and_a_sealed_one_is_read_again_from_the_page_cache(
    tmp_path: pathlib.Path,
) -> None:
    """Active segments bypass the page cache (no stale zero-filled last page,
    whoever reads); sealed ones keep their pages across opens. Growth,
    truncation and reads during appends show the right bytes."""
    rng = random.Random(17)
    with mounted_daemon(tmp_path) as daemon, SyncClient(daemon.address) as c:
        path = daemon.mnt / "grow/s"
        c.create("grow/s")
        # The end falls inside a page: the kernel would cache that page zero-filled.
        data = rng.randbytes(6 * MiB + 1234)
        for i in range(0, len(data), MiB):
            c.append("grow/s", data[i : i + MiB])
        wait_for_size(path, len(data))
        assert run("cat", path).stdout == data
        served = fuse_read_bytes(daemon)
        assert run("cat", path).stdout == data
        # Served by the daemon again: no page cache for a file that grows.
        assert fuse_read_bytes(daemon) - served >= len(data)
        # A shared mapping of a direct-I/O FUSE file is refused by the kernel;
        # a private one works.
        with open(path, "rb") as f:
            with pytest.raises(OSError) as e:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert e.value.errno == errno.ENODEV
            private = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
            assert private[:4096] == data[:4096]
            private.close()

        # Growth: the old last page must not be served zero-filled.
        tail = rng.randbytes(100 * KiB + 7)
        c.append("grow/s", tail)
        data += tail
        wait_for_size(path, len(data))
        assert run("cat", path).stdout == data
        assert run("tail", "-c", "5000", path).stdout == data[-5000:]

        # Truncation: zeros below the start, at once for a new open.
        c.truncate("grow/s", 3 * MiB + 17)
        expected = bytes(3 * MiB + 17) + data[3 * MiB + 17 :]
        wait_for(lambda: run("cat", path).stdout == expected, 5, "zeros below the new start")

        # Reading while it grows fast: never stale zeros, never short of the
        # size the kernel reported when the read started.
        stop = time.monotonic() + 4
        appended = [len(data)]

        def writer() -> None:
            with SyncClient(daemon.address) as w:
                while time.monotonic() < stop:
                    piece = rng.randbytes(rng.choice([1, 100, 3000, 4096, 70 * KiB]))
                    # Known before it is sent: a reader may see an append
                    # before its acknowledgement reaches this thread.
                    expected_parts.append(piece)
                    w.append("grow/s", piece)
                    appended[0] += len(piece)

        expected_parts: list[bytes] = [expected]
        thread = threading.Thread(target=writer)
        thread.start()
        reads = 0
        try:
            while time.monotonic() < stop:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    got = f.read()
                whole = b"".join(expected_parts)
                assert len(got) >= size, f"short read: {len(got)} < {size}"
                assert got == whole[: len(got)], "the bytes read differ from those appended"
                reads += 1
        finally:
            thread.join(30)
        assert reads > 5
        whole = b"".join(expected_parts)
        wait_for_size(path, len(whole))
        assert run("cat", path).stdout == whole

        # Readers holding the file open (tail -f), several at once, while it
        # grows by lines: never a zero where an appended byte is.
        held_stop = time.monotonic() + 6
        line_writer = threading.Thread(target=append_lines, args=(daemon.address, held_stop))
        line_writer.start()
        readers = [
            threading.Thread(target=follow_lines, args=(daemon.mnt / "grow/lines", held_stop))
            for _ in range(4)
        ]
        wait_for_size_at_least(daemon.mnt / "grow/lines", 1)
        for t in readers:
            t.start()
        for t in (line_writer, *readers):
            t.join(60)
        assert not FOLLOW_ERRORS, FOLLOW_ERRORS[:3]

        # Sealed: its pages survive new opens and new processes.
        c.seal("grow/s")
        assert run("cat", path).stdout == whole
        served = fuse_read_bytes(daemon)
        for _ in range(2):
            assert run("cat", path).stdout == whole
        # Not exactly 0: reclaim under a busy machine may take a few pages.
        again = fuse_read_bytes(daemon) - served
        assert again < len(whole) // 10, f"the re-reads took {again} bytes from the daemon"


FOLLOW_ERRORS: list[str] = []


def line_of(i: int) -> bytes:
    return b"line %09d\n" % i


def append_lines(address: str, until: float) -> None:
    """Appends numbered lines in small batches until ``until``."""
    with SyncClient(address) as w:
        w.create("grow/lines", codec="lines")
        i = 0
        while time.monotonic() < until:
            n = random.randint(1, 40)
            w.append("grow/lines", b"".join(line_of(j) for j in range(i, i + n)))
            i += n


def follow_lines(path: pathlib.Path, until: float) -> None:
    """Reads ``path`` like tail -f through one open descriptor; records any wrong line."""
    got = bytearray()
    with open(path, "rb", buffering=0) as f:
        while time.monotonic() < until + 1:
            piece = f.read(1 << 20)
            if not piece:
                time.sleep(0.002)  # tail -f's pause at the end of the file
                continue
            got += piece
            whole = got[: got.rfind(b"\n") + 1]
            count = len(whole) // len(line_of(0))
            if whole != b"".join(line_of(j) for j in range(count)):
                FOLLOW_ERRORS.append(f"{path}: wrong bytes at or after {len(whole) - 200}")
                return


def wait_for_size_at_least(path: pathlib.Path, size: int, s: float = 10) -> None:
    wait_for(lambda: os.stat(path).st_size >= size, s, f"{path} reaching {size} bytes")


@pytest.fixture
def random_read_file(s3_daemon: MountedDaemon) -> Iterator[tuple[pathlib.Path, bytes]]:
    """A segment partly truncated, partly only in Tier 2 (cache wiped), partly cached."""
    rng = random.Random(3)
    with SyncClient(s3_daemon.address) as c:
        data = append_random(c, "r/s", 3 * MiB, rng)
        c.flush("r/s")
    s3_daemon.stop()
    shutil.rmtree(s3_daemon.data_dir / "cache")
    s3_daemon.start(timeout=60)
    with SyncClient(s3_daemon.address) as c:
        tail = rng.randbytes(500 * KiB + 3)
        c.append("r/s", tail)
        c.truncate("r/s", 123_457)
    yield s3_daemon.mnt / "r/s", bytes(123_457) + (data + tail)[123_457:]


@pytest.mark.timeout(240)
def test_random_seeks_and_reads_match(random_read_file: tuple[pathlib.Path, bytes]) -> None:
    path, expected = random_read_file
    size = len(expected)
    with open(path, "rb") as f:
        assert os.fstat(f.fileno()).st_size == size

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(
            offset=st.one_of(
                st.integers(0, size + 1000),
                st.sampled_from([0, 123_456, 123_457, 1 * MiB - 1, size - 1, size]),
            ),
            length=st.integers(0, 600 * KiB),
        )
        def one(offset: int, length: int) -> None:
            f.seek(offset)
            assert f.read(length) == expected[offset : offset + length]

        one()
    # os.pread on a fresh descriptor, too (no Python buffering in the way).
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in random.Random(5).sample(range(size), 50):
            assert os.pread(fd, 4096, offset) == expected[offset : offset + 4096]
    finally:
        os.close(fd)


@pytest.mark.serial  # find over 10,000 segments within 10 s (tests/conftest.py)
@pytest.mark.timeout(240)
async def test_ten_thousand_segments_list_quickly(tmp_path: pathlib.Path) -> None:
    # Tier 2 on a local directory: with S3 every create also claims its name
    # there (names are unique cluster-wide), a minute of PUTs this test is
    # not about; the listing comes from the container either way.
    with mounted_daemon(tmp_path, f'[tier2]\nurl = "file://{tmp_path}/tier2"\n') as daemon:
        await _list_ten_thousand(daemon)


async def _list_ten_thousand(daemon: MountedDaemon) -> None:
    names = [f"many/d{i // 1000}/s{i:05d}" for i in range(9000)]
    names += [f"flat/s{i:04d}" for i in range(1000)]
    async with open_client(daemon.address) as c:
        limiter = trio.Semaphore(64)  # pipelined creates on one connection

        async def create(name: str) -> None:
            async with limiter:
                await c.create(name)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(create, name)
    mnt = daemon.mnt

    def listing() -> tuple[float, list[str]]:
        started = time.monotonic()
        r = run("find", mnt, "-type", "f", timeout=60)
        return time.monotonic() - started, r.stdout.decode().split()

    took, found = await trio.to_thread.run_sync(listing)
    assert sorted(p.removeprefix(str(mnt) + "/") for p in found) == sorted(names)
    assert took < 10, f"find over 10,000 segments took {took:.1f}s"
    started = time.monotonic()
    r = await trio.to_thread.run_sync(lambda: run("ls", "-l", mnt / "many/d3"))
    took = time.monotonic() - started
    assert r.stdout.decode().count("-r--r--r--") == 1000
    assert took < 5, f"ls -l of 1,000 segments took {took:.1f}s"


@pytest.mark.timeout(120)
def test_deleting_a_segment_held_open_gives_estale(s3_daemon: MountedDaemon) -> None:
    """docs/OPERATIONS.md, "The mount": every path it names for a deleted segment."""
    rng = random.Random(11)
    mnt = s3_daemon.mnt
    names = ("del/sealed", "del/active")
    with SyncClient(s3_daemon.address) as c:
        for name in names:
            append_random(c, name, 2 * MiB, rng)
        c.seal("del/sealed")  # long kernel timeouts and keep_cache, which deletion must cut
        reader = subprocess.Popen(
            [sys.executable, "-c", READ_AFTER_DELETE, *(str(mnt / n) for n in names)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None and reader.stdin is not None
            assert reader.stdout.readline() == "opened\n", reader.stderr
            for name in names:
                c.delete(name)
            c.create("del/sealed")  # the name again, a new segment
            c.append("del/sealed", b"new")
            reader.stdin.write("go\n")
            reader.stdin.flush()
            out, err = reader.communicate(timeout=60)
        finally:
            reader.kill()
            reader.communicate()
    assert reader.returncode == 0, err
    results = dict(line.split(" ", 1) for line in out.splitlines())
    stale = "fstat=ESTALE warm=ESTALE cold=ESTALE xattr=ESTALE"
    # The open file: attributes, cached pages, uncached pages, xattrs.
    assert results["del/sealed"].startswith(stale), results
    assert results["del/active"].startswith(stale), results
    # By name: the new segment, or nothing (a fresh lookup).
    assert results["del/sealed"].endswith("stat=3 open=b'new'"), results
    assert results["del/active"].endswith("stat=ENOENT open=ENOENT"), results
    assert (mnt / "del/sealed").read_bytes() == b"new"
    # The .events file is a snapshot taken at open: still readable.
    assert results["events"].startswith(repr(b"0\n")[:-1]), results


READ_AFTER_DELETE = """
import errno, os, sys, time
paths = sys.argv[1:]
fds = [os.open(p, os.O_RDONLY) for p in paths]
for fd in fds:
    os.pread(fd, 65536, 0)  # warm: these pages are in the page cache now
head, _, base = paths[-1].rpartition("/")
events = os.open(f"{head}/.{base}.events", os.O_RDONLY)
print("opened", flush=True)
sys.stdin.readline()

def errno_of(call):
    try:
        got = call()
    except OSError as e:
        return errno.errorcode[e.errno]
    return got

def read_path(p):
    with open(p, "rb") as f:
        return f.read()

for path, fd in zip(paths, fds):
    # The mount invalidates the kernel's caches from a worker thread, just
    # after the deletion: wait for it.
    deadline = time.monotonic() + 10
    while errno_of(lambda: os.fstat(fd) and None) != "ESTALE" and time.monotonic() < deadline:
        time.sleep(0.01)
    found = {
        "fstat": errno_of(lambda: os.fstat(fd).st_size),
        "warm": errno_of(lambda: len(os.pread(fd, 4096, 0))),
        "cold": errno_of(lambda: len(os.pread(fd, 4096, 1024 * 1024 + 4096))),
        "xattr": errno_of(lambda: os.getxattr(fd, "user.segment.length")),
        "stat": errno_of(lambda: os.stat(path).st_size),
        "open": errno_of(lambda: read_path(path)),
    }
    name = "/".join(path.split("/")[-2:])
    print(name, " ".join(f"{k}={v}" for k, v in found.items()), flush=True)
print("events", repr(os.pread(events, 4096, 0)))
"""


@pytest.mark.timeout(120)
def test_killing_the_daemon_with_the_mount_busy_hangs_nothing(s3_daemon: MountedDaemon) -> None:
    with SyncClient(s3_daemon.address) as c:
        c.create("busy/s")
        c.append("busy/s", b"x" * 100_000)
    path = s3_daemon.mnt / "busy/s"
    readers = [
        subprocess.Popen(["tail", "-f", str(path)], stdout=subprocess.DEVNULL),
        subprocess.Popen(
            [sys.executable, "-c", "import sys\nwhile True: open(sys.argv[1],'rb').read()", path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        # Both readers at work when the daemon dies: tail holds the file open,
        # and the loop has opened it (it keeps reopening it).
        def reading(proc: subprocess.Popen[bytes]) -> bool:
            fds = pathlib.Path(f"/proc/{proc.pid}/fd")
            return any(os.readlink(fd) == str(path) for fd in fds.iterdir())

        for reader in readers:
            wait_for(
                lambda reader=reader: reading(reader),
                10,
                f"{reader.args!r} reading",
                interval=0.001,
            )  # type: ignore[misc]
        s3_daemon.kill()
        # The dead mount answers ENOTCONN; readers fail instead of hanging.
        r = run("stat", path, check=False, timeout=10)
        assert r.returncode != 0 and b"not connected" in r.stderr, r.stderr
        readers[1].wait(10)
        # A restart clears the stale mount and serves again.
        s3_daemon.start(timeout=60)
        assert "stale" in s3_daemon.log()
        assert run("cat", path).stdout == b"x" * 100_000
    finally:
        for p in readers:
            p.kill()
            p.wait(10)


@pytest.mark.expect_errors(r"read of 'lost/s' at offset \d+ \(\d+ bytes\) failed: Tier-2 object")
def test_tier2_failure_is_eio_with_a_log_line(tmp_path: pathlib.Path) -> None:
    require_fuse()
    config = f'[tier2]\nurl = "file://{tmp_path}/tier2"\nflush_size = "256 KiB"\n'
    with mounted_daemon(tmp_path, config) as daemon:
        with SyncClient(daemon.address) as c:
            c.create("lost/s")
            c.append("lost/s", random.Random(1).randbytes(600 * KiB))
            c.flush("lost/s")
        daemon.stop()
        shutil.rmtree(daemon.data_dir / "cache")
        chunks = list((tmp_path / "tier2").rglob("*.e*"))
        chunks = [p for p in chunks if ".meta" not in p.parts and "chunks" in p.parts]
        assert chunks
        for p in chunks:
            p.unlink()
        daemon.start(timeout=60)
        r = run("cat", daemon.mnt / "lost/s", check=False)
        assert r.returncode != 0 and b"Input/output error" in r.stderr, r.stderr
        log = daemon.log()
        assert "read of 'lost/s' at offset 0" in log, log
        # The daemon still serves: the failure is per read.
        assert run("ls", daemon.mnt / "lost").stdout == b"s\n"


def test_a_live_mount_in_the_way_is_refused(tmp_path: pathlib.Path) -> None:
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        daemon = MountedDaemon(tmp_path / "node", mnt)
        with pytest.raises(RuntimeError, match="exited with 28"):
            daemon.start(timeout=30)
        assert "a live tmpfs filesystem is mounted there" in daemon.log()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
