#!/usr/bin/env python3
"""FUSE read benchmark: the mount against s3fs-fuse, rclone, boto3 and a local file.

One embedded S3 server (SeaweedFS, `gateway.embedded.EmbeddedS3`) runs
for the whole benchmark. A real daemon (its own process, `[tier2]` pointing
at that server, segments mounted) gets one segment of --size bytes (default
1 GiB; 1 MiB appends of seeded random bytes), which is sealed and flushed:
chunk objects of up to 64 MiB (flush_size = max_chunk_size = 64 MiB; about
16 for 1 GiB), nothing left that Tier 2 does not hold. The same bytes are
also written to a local file. Then, every round:

* **ours**: ``dd if=<mount>/bench/seg of=/dev/null bs=1M`` in three states:
  *cold* (daemon stopped, its cache directory deleted, restarted; page cache
  dropped), *warm* (the same file again: sealed segments keep their pages),
  *RocksDB warm* (every 1 MiB block read once over the protocol in a random
  order, so that each is a direct read and goes into the cache store; daemon
  restarted so its memory holds nothing; page cache dropped). A fourth, not
  a target: RocksDB warm with RocksDB's files still in the page cache (the
  daemon restarted again right after the RocksDB-warm read; the new mount
  has no pages of its own). SeaweedFS's written bytes are counted during
  each dd: the cold read must fetch the segment, the RocksDB-warm ones must
  not.
* **s3fs-fuse** (Debian `s3fs`, defaults: no disk cache) and **rclone
  mount** (Debian `rclone`, ``--vfs-cache-mode off`` and ``full``, a fresh
  cache each time) mounting the same bucket: dd of the segment's chunk
  objects one after another, in key order (their concatenation is the
  segment). Each mount is fresh and the page cache dropped.
* **boto3**: one GET per chunk object, sequentially (``Body.read()``), and
  8 threads doing 8 MiB ranged GETs over the chunk objects.
* **local file**: dd with the page cache dropped, then again from it.

Also, from a cold state (page cache dropped, fresh mounts, our cache
wiped): first-byte latency (``open`` + ``pread`` of 4 KiB at an offset no
one read before, then ``close``; a 4 KiB ranged GET for boto3) and 4 KiB
random-read IOPS (4 threads; each read in a different 1 MiB block, at most
10 s). Offsets come from a seeded RNG and are the same for every system in
a round. The page cache is dropped before every cold measurement, which
drops SeaweedFS's files too: every system reads from the same server and
disk. The systems' order rotates from round to round.

Reads from S3 or a cold disk are timed by the wall clock around the dd
processes (opens included); page-cache reads (a GiB in ~0.1 s) by dd's own
clock, median of 3 dd runs.

* **active** (the page cache across opens of a segment still being
  written): two segments of --active-size bytes (default 256 MiB; 1 MiB
  appends), one left active, one sealed, written in the same daemon. With
  the page cache dropped, each is read 5 times with dd, a new open each
  time, alternately (each first in turn); the re-reads' MB/s (dd's own clock) of the active one
  against the sealed one's, and the bytes the daemon wrote meanwhile (its
  replies to the kernel's reads go through ``write``: ``wchar``), which a
  re-read from the page cache leaves at ~0. Then 1 MiB is appended to the
  active one and, once ``stat`` shows it, the file read once more: what
  growth costs (the kernel drops the file's pages when it sees a new size).

Every sequential read is checked: a CRC32C of the bytes read back through
each mount (right after its timed dd) against the expected one; every
4 KiB read is compared with the expected bytes.

Targets (the FUSE issue): cold ≥ 1.25 times s3fs-fuse and ≥ 2 times rclone
(cache off); page-cache warm ≥ 0.7 times the local file from the page cache;
RocksDB warm ≥ 1 GB/s.

Prints one JSON document (progress on stderr); with --write-table also
rewrites the FUSE section of docs/PERFORMANCE.md. Needs root (drop_caches,
mounts, apt-get). --quick: 1 round, a 256 MiB segment. --parts runs only
some systems (e.g. ``--parts ours,boto3,active``; default: all); the table
is written only for a full run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import pathlib
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    ensure_rclone,
    ensure_s3fs,
    replace_table,
    running_daemon,
    sigterm_as_interrupt,
)

from gateway import __version__  # noqa: E402
from gateway.client.client import SyncClient  # noqa: E402
from gateway.embedded import EmbeddedS3  # noqa: E402
from gateway.errors import SegmentNotFound  # noqa: E402
from gateway.storage.s3 import S3Storage  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TABLE_START = "<!-- bench/fuse_read.py:start -->"
TABLE_END = "<!-- bench/fuse_read.py:end -->"
SECTION_HEADING = "## The FUSE mount: `bench/fuse_read.py`"

TARGET_COLD_VS_S3FS = 1.25
TARGET_COLD_VS_RCLONE = 2.0
TARGET_WARM_VS_LOCAL = 0.7
TARGET_ROCKSDB_MBPS = 1000.0
#: 4 KiB random reads from a cold state against boto3's 4 KiB ranged GETs.
TARGET_IOPS_VS_BOTO3 = 0.8
TARGET_FIRST_BYTE_VS_BOTO3 = 2.0
#: Re-reads of an active segment against those of a sealed one.
TARGET_ACTIVE_VS_SEALED = 0.8

SEGMENT = "bench/seg"
PREFIX = "gw"
NODE = "node-1"
APPEND = 1 * MiB
CHUNK_SIZE = 64 * MiB
SEED = 20261122
PAGE = 4 * KiB
LATENCY_SAMPLES = 10
IOPS_READS = 200
IOPS_THREADS = 4
IOPS_SECONDS = 10.0
RAW_THREADS = 8
#: The active-segment case: its segments, and reads of each (the first fills the page cache).
ACTIVE_SEGMENT = "bench/active"
SEALED_COPY = "bench/sealed-copy"
ACTIVE_READS = 5
RAW_RANGE = 8 * MiB
#: The RocksDB-warm read counts as served by the cache when SeaweedFS wrote
#: less than this share of the segment meanwhile (its logs, heartbeats).
MAX_S3_SHARE_WARM = 0.05
MOUNT_TIMEOUT = 30.0
DD_TIMEOUT = 900.0
#: Page-cache reads of a file per round (their median counts).
WARM_DDS = 3
#: Time for the daemon's background cache writes to finish after warming.
CACHE_SETTLE = 2.0

#: Labels of the sequential modes, in table order.
SEQ_MODES = {
    "ours_cold": "ours, cold (cache wiped, page cache dropped)",
    "ours_warm": "ours, page cache warm",
    "ours_rocksdb": "ours, RocksDB warm (page cache dropped, daemon restarted)",
    "ours_rocksdb_mem": "ours, RocksDB warm, its files in the page cache (daemon restarted)",
    "s3fs": "s3fs-fuse (defaults, no disk cache)",
    "rclone_off": "rclone mount, --vfs-cache-mode off",
    "rclone_full": "rclone mount, --vfs-cache-mode full (empty cache)",
    "boto3_single": "boto3, one GET per chunk object, in turn",
    "boto3_parallel": f"boto3, {RAW_THREADS} threads × {RAW_RANGE >> 20} MiB ranged GETs",
    "local_cold": "local file, page cache dropped",
    "local_warm": "local file, page cache warm",
}
#: Systems with first-byte latency and random-read IOPS, in table order.
RANDOM_SYSTEMS = {
    "ours": "ours (cache wiped)",
    "s3fs": "s3fs-fuse",
    "rclone_off": "rclone mount, cache off",
    "boto3": "boto3 ranged GET",
    "local": "local file",
}
#: What --parts can name: the systems of every round, and the active-segment case.
PARTS = ("ours", "s3fs", "rclone_off", "rclone_full", "boto3", "local", "active")


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# -- the machine ------------------------------------------------------------------------


def drop_page_cache() -> None:
    """Write back dirty pages, then drop the page cache (and dentries, inodes)."""
    os.sync()
    try:
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise SystemExit(f"cannot drop the page cache (needs root): {e}") from None


def proc_io(pid: int | None, field: str) -> int:
    """A counter of ``/proc/PID/io`` (``wchar``: bytes written to files and sockets;
    ``read_bytes``: bytes read from storage), or 0 if the process is gone."""
    if pid is None:
        return 0
    try:
        for line in pathlib.Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_cpu(pid: int | None, system_only: bool = False) -> float:
    """User + system (or only system) CPU seconds of a process so far; 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[12]) + (0 if system_only else int(fields[11]))
    return ticks / os.sysconf("SC_CLK_TCK")


def find_pid(needle: str) -> int | None:
    """The process whose command line contains ``needle`` (the daemon's config path)."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            return int(entry.name)
    return None


def is_mounted(path: pathlib.Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def lazy_unmount(path: pathlib.Path) -> None:
    if is_mounted(path):
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


# -- reading ------------------------------------------------------------------------------


def dd(paths: list[pathlib.Path]) -> tuple[float, float, int]:
    """``dd bs=1M`` of each file in turn to /dev/null.

    Returns the wall-clock seconds of the whole loop (processes, opens and
    all), the seconds dd itself reports (its copy loops only), and the bytes.
    """
    total, own = 0, 0.0
    started = time.perf_counter()
    for p in paths:
        out = subprocess.run(
            ["dd", f"if={p}", "of=/dev/null", "bs=1M"],
            check=True, capture_output=True, text=True, timeout=DD_TIMEOUT,
        )  # fmt: skip
        # "N bytes (...) copied, S s, R MB/s" on its last line
        for line in out.stderr.splitlines():
            if " bytes " in line and "copied, " in line:
                total += int(line.split()[0])
                own += float(line.split("copied, ")[1].split()[0])
    return time.perf_counter() - started, own, total


def crc_of(paths: list[pathlib.Path]) -> tuple[int, int]:
    """CRC32C and length of the files' concatenation, read in 1 MiB pieces."""
    crc, total = 0, 0
    buf = bytearray(MiB)
    view = memoryview(buf)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                crc = crc32c.crc32c(view[:n], crc)
                total += n
    return crc, total


@dataclass
class Expected:
    """The segment's bytes and what checks them."""

    content: bytes
    crc: int

    @property
    def size(self) -> int:
        return len(self.content)

    def check(self, label: str, crc: int, length: int) -> None:
        if length != self.size or crc != self.crc:
            raise AssertionError(
                f"{label}: read {length} bytes with CRC32C {crc:08x}, "
                f"expected {self.size} bytes with {self.crc:08x}"
            )

    def check_files(self, label: str, paths: list[pathlib.Path]) -> None:
        self.check(label, *crc_of(paths))


#: Where segment offset X is: (file, offset in that file).
Locate = Callable[[int], tuple[pathlib.Path, int]]


def first_byte(locate: Locate, offsets: list[int], expected: Expected) -> list[float]:
    """Milliseconds from ``open`` to the first 4 KiB ``pread`` returning, one per offset."""
    samples = []
    for offset in offsets:
        path, at = locate(offset)
        started = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, PAGE, at)
            samples.append((time.perf_counter() - started) * 1e3)
        finally:
            os.close(fd)
        if data != expected.content[offset : offset + PAGE]:
            raise AssertionError(f"4 KiB read of {path} at {at} returned the wrong bytes")
    return samples


def random_iops(
    read_page: Callable[[int], bytes], offsets: list[int], expected: Expected
) -> dict[str, float]:
    """4 KiB reads at ``offsets``, `IOPS_THREADS` at a time, for at most `IOPS_SECONDS`."""
    pending = iter(offsets)
    lock = threading.Lock()
    done = [0]
    deadline = time.perf_counter() + IOPS_SECONDS

    def worker() -> None:
        while time.perf_counter() < deadline:
            with lock:
                offset = next(pending, None)
            if offset is None:
                return
            if read_page(offset) != expected.content[offset : offset + PAGE]:
                raise AssertionError(f"4 KiB read at segment offset {offset}: wrong bytes")
            with lock:
                done[0] += 1

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(IOPS_THREADS) as pool:
        for f in [pool.submit(worker) for _ in range(IOPS_THREADS)]:
            f.result()
    elapsed = time.perf_counter() - started
    return {"iops": done[0] / elapsed, "reads": done[0], "seconds": elapsed}


def file_iops(locate: Locate, offsets: list[int], expected: Expected) -> dict[str, float]:
    """`random_iops` with ``pread`` on files opened beforehand (the opens are not timed)."""
    places = {o: locate(o) for o in offsets}
    fds = {p: os.open(p, os.O_RDONLY) for p in {path for path, _ in places.values()}}
    try:

        def read_page(offset: int) -> bytes:
            path, at = places[offset]
            return os.pread(fds[path], PAGE, at)

        return random_iops(read_page, offsets, expected)
    finally:
        for fd in fds.values():
            os.close(fd)


def random_offsets(size: int, rnd: int) -> tuple[list[int], list[int]]:
    """First-byte and IOPS offsets for round ``rnd``: 4 KiB aligned, each in its own MiB."""
    rng = random.Random(SEED + 1000 + rnd)
    blocks = size // MiB
    wanted = min(blocks, LATENCY_SAMPLES + IOPS_READS)
    chosen = [
        b * MiB + rng.randrange(MiB // PAGE) * PAGE for b in rng.sample(range(blocks), wanted)
    ]
    return chosen[:LATENCY_SAMPLES], chosen[LATENCY_SAMPLES:]


# -- the systems under test ---------------------------------------------------------------


@dataclass
class Chunk:
    key: str
    start: int
    length: int


class Bench:
    """The benchmark's state: the server, the daemon's directories, the chunk objects."""

    def __init__(self, work: pathlib.Path, size: int) -> None:
        self.work = work
        self.size = size
        self.server = EmbeddedS3(work / "s3")
        self.daemon_dir = work / "daemon"
        self.data_dir = work / "gateway-data"
        self.mnt = work / "mnt"
        self.peer_mnt = work / "peer-mnt"
        self.local = work / "local.bin"
        self.chunks: list[Chunk] = []
        self.expected = Expected(b"", 0)
        self.storage: S3Storage | None = None
        self.s3fs = ""
        self.rclone = ""
        self.daemon_pid: int | None = None

    # -- set-up

    def start(self, peers: bool = True) -> None:
        if peers:
            self.s3fs = ensure_s3fs()
            self.rclone = ensure_rclone()
        log("starting SeaweedFS")
        self.server.start()
        s = self.server
        # The daemon's S3 binding takes credentials from the environment.
        os.environ["AWS_ACCESS_KEY_ID"] = s.access_key
        os.environ["AWS_SECRET_ACCESS_KEY"] = s.secret_key
        self.storage = S3Storage(
            s.bucket, endpoint_url=s.endpoint_url, max_pool_connections=2 * RAW_THREADS,
            timeout=60.0, access_key=s.access_key, secret_key=s.secret_key,
        )  # fmt: skip
        self.daemon_dir.mkdir()
        self.peer_mnt.mkdir()

    def stop(self) -> None:
        for path in (self.peer_mnt, self.mnt):
            lazy_unmount(path)
        if self.storage is not None:
            self.storage.close()
        self.server.stop()

    @property
    def config_text(self) -> str:
        return (
            f'[node]\nid = "{NODE}"\n'
            f'[tier2]\nurl = "s3://{self.server.bucket}/{PREFIX}"\n'
            f'endpoint_url = "{self.server.endpoint_url}"\n'
            # Flushed in whole chunks of max_chunk_size: 16 chunk objects for 1 GiB
            # (with the default 8 MiB the layout depends on the writer's timing).
            f'flush_size = "{CHUNK_SIZE >> 20} MiB"\nmax_chunk_size = "{CHUNK_SIZE >> 20} MiB"\n'
            'flush_interval = "1h"\n'
        )

    @contextlib.contextmanager
    def daemon(self, wipe_cache: bool, has_segment: bool = True) -> Iterator[str]:
        """The daemon with the segments mounted at `mnt`; its cache deleted first if asked.

        With ``has_segment``, wait until the mount shows the segment.
        """
        if wipe_cache:
            shutil.rmtree(self.data_dir / "cache", ignore_errors=True)
        (self.daemon_dir / "ready").unlink(missing_ok=True)  # the last run's address
        with running_daemon(
            self.daemon_dir, self.config_text, data_dir=self.data_dir, mountpoint=self.mnt
        ) as address:
            self.daemon_pid = find_pid(str(self.daemon_dir / "gateway.toml"))
            deadline = time.monotonic() + MOUNT_TIMEOUT
            while has_segment and not (self.mnt / SEGMENT).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.mnt / SEGMENT} did not appear")
                time.sleep(0.05)
            try:
                yield address
            finally:
                self.daemon_pid = None

    def build(self) -> None:
        """The segment (sealed, flushed), its chunk objects listed, the local copy."""
        size = self.size
        log(f"generating {size >> 20} MiB")
        rng = random.Random(SEED)
        content = b"".join(rng.randbytes(min(64 * MiB, size - i)) for i in range(0, size, 64 * MiB))
        self.expected = Expected(content, crc32c.crc32c(content))
        with open(self.local, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        log("writing the segment through the daemon")
        started = time.perf_counter()
        with self.daemon(wipe_cache=False, has_segment=False) as address, SyncClient(address) as c:
            c.create(SEGMENT)
            view = memoryview(content)
            for i in range(0, size, APPEND):
                c.append(SEGMENT, bytes(view[i : i + APPEND]))
            c.seal(SEGMENT)
            c.flush(SEGMENT)
            info = c.info(SEGMENT)
            seg_id = info.id
        log(
            f"segment written, sealed and flushed in {time.perf_counter() - started:.1f} s: "
            f"{info.length} bytes, {info.storage_length} in storage, {info.chunk_count} chunks"
        )
        if not (info.sealed and info.length == size and info.storage_length == size):
            raise AssertionError(f"the segment is not sealed and fully offloaded: {info}")
        assert self.storage is not None
        client, bucket = self.storage.client, self.server.bucket
        prefix = f"{PREFIX}/{NODE}/chunks/{seg_id}/"
        keys = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        keys.sort()
        start = 0
        for key, length in keys:
            if int(key.rsplit("/", 1)[1].split(".")[0]) != start or length % PAGE:
                raise AssertionError(f"unexpected chunk object {key} ({length} bytes) at {start}")
            self.chunks.append(Chunk(key, start, length))
            start += length
        if start != size or len(keys) != info.chunk_count:
            raise AssertionError(f"chunk objects {keys} do not make up the segment")
        log(f"{len(keys)} chunk objects, MiB: {[round(n / MiB, 1) for _, n in keys]}")

    # -- where offsets are

    def ours_locate(self, offset: int) -> tuple[pathlib.Path, int]:
        return self.mnt / SEGMENT, offset

    def local_locate(self, offset: int) -> tuple[pathlib.Path, int]:
        return self.local, offset

    def chunk_of(self, offset: int) -> Chunk:
        return next(c for c in self.chunks if c.start <= offset < c.start + c.length)

    def peer_locate(self, offset: int) -> tuple[pathlib.Path, int]:
        c = self.chunk_of(offset)
        return self.peer_mnt / c.key, offset - c.start

    def peer_files(self) -> list[pathlib.Path]:
        return [self.peer_mnt / c.key for c in self.chunks]

    # -- ours

    def timed_dd(self, paths: list[pathlib.Path]) -> dict[str, float]:
        """One dd of ``paths``, MB/s by the wall clock; SeaweedFS and the daemon observed."""
        weed = self.server.pid
        w0, c0 = proc_io(weed, "wchar"), proc_cpu(weed)
        d0, r0 = proc_cpu(self.daemon_pid), proc_io(self.daemon_pid, "read_bytes")
        k0 = proc_cpu(self.daemon_pid, system_only=True)
        wall, own, length = dd(paths)
        if length != self.size:
            raise AssertionError(f"dd read {length} bytes of {paths}, expected {self.size}")
        return {
            "MBps": self.size / wall / 1e6,
            "dd_MBps": self.size / own / 1e6,
            "s3_wrote_MiB": (proc_io(weed, "wchar") - w0) / MiB,
            "s3_cpu_s": proc_cpu(weed) - c0,
            "daemon_cpu_s": proc_cpu(self.daemon_pid) - d0 if self.daemon_pid else 0.0,
            "daemon_system_cpu_s": (
                proc_cpu(self.daemon_pid, system_only=True) - k0 if self.daemon_pid else 0.0
            ),
            "daemon_disk_read_MiB": (proc_io(self.daemon_pid, "read_bytes") - r0) / MiB,
        }

    def warm_dd(self, paths: list[pathlib.Path]) -> dict[str, float]:
        """Median of `WARM_DDS` dds from the page cache, by dd's own clock.

        A warm GiB takes ~0.1 s, so starting the process would be a tenth of it.
        With the daemon running, the local file is read in between (the same
        number of times): page-cache speed moves with the machine's load, so
        the warm ratio compares reads made in the same seconds.
        """
        d0 = proc_cpu(self.daemon_pid)
        runs: list[float] = []
        local: list[float] = []
        for _ in range(WARM_DDS):
            for target, into in [(paths, runs), ([self.local], local)]:
                if into is local and self.daemon_pid is None:
                    continue
                _, own, length = dd(target)
                if length != self.size:
                    raise AssertionError(f"dd read {length} bytes of {target}, not {self.size}")
                into.append(self.size / own / 1e6)
        out = {
            "MBps": statistics.median(runs),
            "daemon_cpu_s": proc_cpu(self.daemon_pid) - d0 if self.daemon_pid else 0.0,
        }
        if local:
            out["local_MBps"] = statistics.median(local)
            out["vs_local"] = out["MBps"] / out["local_MBps"]
        return out

    def run_ours(self, rnd: int, latency: list[int], iops: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        seg = [self.mnt / SEGMENT]
        with self.daemon(wipe_cache=True):
            drop_page_cache()
            out["ours_cold"] = r = self.timed_dd(seg)
            log(f"round {rnd} ours cold: {r['MBps']:.0f} MB/s ({self._detail(r)})")
            if r["s3_wrote_MiB"] < self.size / MiB:
                raise AssertionError(f"the cold read did not fetch the segment from S3: {r}")
            self.expected.check_files("ours, cold", seg)
            dd([self.local])  # into the page cache, for the paired baseline
            out["ours_warm"] = r = self.warm_dd(seg)
            log(
                f"round {rnd} ours page-cache warm: {r['MBps']:.0f} MB/s, the local file "
                f"meanwhile {r['local_MBps']:.0f} MB/s ({r['vs_local']:.2f}x)"
            )
        with self.daemon(wipe_cache=True) as address:
            drop_page_cache()
            out["first_byte_ms"] = first_byte(self.ours_locate, latency, self.expected)
            drop_page_cache()
            out["iops"] = r = file_iops(self.ours_locate, iops, self.expected)
            log(
                f"round {rnd} ours first byte p50 {statistics.median(out['first_byte_ms']):.1f} "
                f"ms, 4 KiB random {r['iops']:.0f} IOPS"
            )
            out["warming"] = self.warm_rocksdb(address, rnd)
        cache_mib = du(self.data_dir / "cache") / MiB
        # A restart: the daemon's memory holds no block, the new mount no page.
        with self.daemon(wipe_cache=False):
            drop_page_cache()
            out["ours_rocksdb"] = r = self.timed_dd(seg)
            r["cache_dir_MiB"] = cache_mib
            log(f"round {rnd} ours RocksDB warm: {r['MBps']:.0f} MB/s ({self._detail(r)})")
            self._check_no_s3(r)
            self.expected.check_files("ours, RocksDB warm", seg)
        # The same, but RocksDB's files stay in the page cache (read just now).
        with self.daemon(wipe_cache=False):
            out["ours_rocksdb_mem"] = r = self.timed_dd(seg)
            r["cache_dir_MiB"] = cache_mib
            log(
                f"round {rnd} ours RocksDB warm, its files in the page cache: "
                f"{r['MBps']:.0f} MB/s ({self._detail(r)})"
            )
            self._check_no_s3(r)
            if r["daemon_cpu_s"] == 0:
                raise AssertionError(f"the read did not go through the daemon: {r}")
        return out

    def _check_no_s3(self, r: dict[str, float]) -> None:
        if r["s3_wrote_MiB"] > MAX_S3_SHARE_WARM * self.size / MiB:
            raise AssertionError(f"the RocksDB-warm read went to S3: {r}")

    def warm_rocksdb(self, address: str, rnd: int) -> dict[str, float]:
        """Read every MiB once over the protocol, in an order where none follows its neighbour.

        Then no read looks sequential, so no read-ahead (whose blocks skip the
        cache store) starts: every block is a direct read, and is cached.
        """
        rng = random.Random(SEED + 2000 + rnd)
        order = list(range(self.size // APPEND))
        rng.shuffle(order)
        for i in range(1, len(order)):
            if order[i] == order[i - 1] + 1:
                j = rng.randrange(len(order))
                order[i], order[j] = order[j], order[i]
        started = time.perf_counter()
        with SyncClient(address) as c:
            for k in order:
                offset = k * APPEND
                data = c.read(SEGMENT, offset, APPEND).data
                if data != self.expected.content[offset : offset + APPEND]:
                    raise AssertionError(f"protocol read at {offset} returned the wrong bytes")
        elapsed = time.perf_counter() - started
        time.sleep(CACHE_SETTLE)  # the daemon's cache writes run in the background
        adjacent = sum(1 for i in range(1, len(order)) if order[i] == order[i - 1] + 1)
        log(f"round {rnd} warmed RocksDB in {elapsed:.1f} s ({adjacent} adjacent pairs left)")
        return {"seconds": elapsed, "adjacent_pairs": adjacent}

    @staticmethod
    def _detail(r: dict[str, float]) -> str:
        return (
            f"SeaweedFS wrote {r['s3_wrote_MiB']:.0f} MiB, used {r['s3_cpu_s']:.1f} s CPU; "
            f"daemon {r['daemon_cpu_s']:.1f} s CPU, read {r['daemon_disk_read_MiB']:.0f} MiB "
            "from disk"
        )

    # -- the peers

    @contextlib.contextmanager
    def peer_mount(self, command: list[str], env: dict[str, str], name: str) -> Iterator[None]:
        """A FUSE peer mounted at `peer_mnt` by ``command``; unmounted, killed however left."""
        log_path = self.work / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + MOUNT_TIMEOUT
            while not is_mounted(self.peer_mnt):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} before mounting:\n"
                        + log_path.read_text(errors="replace")[-2000:]
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not mount in {MOUNT_TIMEOUT:.0f}s")
                time.sleep(0.05)
            # Mounted is not yet answering: wait until the first chunk is visible.
            while not self.peer_files()[0].exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: {self.peer_files()[0]} did not appear")
                time.sleep(0.1)
            yield
        finally:
            lazy_unmount(self.peer_mnt)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def s3fs_mount(self) -> contextlib.AbstractContextManager[None]:
        s = self.server
        passwd = self.work / "s3fs.passwd"
        passwd.write_text(f"{s.access_key}:{s.secret_key}\n")
        passwd.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        command = [
            self.s3fs, s.bucket, str(self.peer_mnt), "-f",
            "-o", f"url={s.endpoint_url}", "-o", "use_path_request_style",
            "-o", f"passwd_file={passwd}", "-o", "ro", "-o", "endpoint=us-east-1",
        ]  # fmt: skip
        return self.peer_mount(command, env, "s3fs")

    def rclone_mount(self, cache_mode: str) -> contextlib.AbstractContextManager[None]:
        s = self.server
        conf = self.work / "rclone.conf"
        conf.write_text(
            "[seaweed]\ntype = s3\nprovider = Other\n"
            f"access_key_id = {s.access_key}\nsecret_access_key = {s.secret_key}\n"
            f"endpoint = {s.endpoint_url}\nregion = us-east-1\nforce_path_style = true\n"
        )
        cache = self.work / "rclone-cache"
        shutil.rmtree(cache, ignore_errors=True)
        # Debian's rclone refuses to start (LoadCustomCABundleError) with AWS_CA_BUNDLE set.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        command = [
            self.rclone, "mount", f"seaweed:{s.bucket}", str(self.peer_mnt),
            "--config", str(conf), "--cache-dir", str(cache), "--read-only",
            "--vfs-cache-mode", cache_mode, "--log-level", "NOTICE",
        ]  # fmt: skip
        return self.peer_mount(command, env, f"rclone-{cache_mode}")

    def run_peer(
        self,
        name: str,
        mount: Callable[[], contextlib.AbstractContextManager[None]],
        rnd: int,
        latency: list[int] | None,
        iops: list[int] | None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with mount():
            drop_page_cache()
            out[name] = r = self.timed_dd(self.peer_files())
            log(f"round {rnd} {name}: {r['MBps']:.0f} MB/s ({self._detail(r)})")
            self.expected.check_files(name, self.peer_files())
        if latency is not None and iops is not None:
            with mount():
                drop_page_cache()
                out["first_byte_ms"] = first_byte(self.peer_locate, latency, self.expected)
                drop_page_cache()
                out["iops"] = r = file_iops(self.peer_locate, iops, self.expected)
                log(
                    f"round {rnd} {name} first byte p50 "
                    f"{statistics.median(out['first_byte_ms']):.1f} ms, "
                    f"4 KiB random {r['iops']:.0f} IOPS"
                )
        return out

    # -- boto3 and the local file

    def run_active(self, rnd: int, size: int) -> dict[str, Any]:
        """An active and a sealed segment of ``size`` bytes, each read `ACTIVE_READS` times."""
        content = self.expected.content[:size]
        paths = {"active": self.mnt / ACTIVE_SEGMENT, "sealed": self.mnt / SEALED_COPY}
        out: dict[str, Any] = {}
        with self.daemon(wipe_cache=False) as address, SyncClient(address) as c:
            for name in (ACTIVE_SEGMENT, SEALED_COPY):
                with contextlib.suppress(SegmentNotFound):
                    c.delete(name)  # left by an interrupted round
                c.create(name)
                for i in range(0, size, APPEND):
                    c.append(name, content[i : i + APPEND])
            c.seal(SEALED_COPY)
            for path in paths.values():
                self._wait_size(path, size)
            drop_page_cache()
            reads: dict[str, list[dict[str, float]]] = {"active": [], "sealed": []}
            for i in range(ACTIVE_READS):
                # Each first in turn: a dd's speed moves with the machine's load.
                for kind in sorted(paths, reverse=bool(i % 2)):
                    reads[kind].append(self._served_dd(paths[kind], size))
            for kind in paths:
                again = reads[kind][1:]
                out[kind] = {
                    "first_MBps": reads[kind][0]["MBps"],
                    "first_served_MiB": reads[kind][0]["served_MiB"],
                    "reread_MBps": statistics.median(r["MBps"] for r in again),
                    "reread_served_MiB": [r["served_MiB"] for r in again],
                }
            out["ratio"] = out["active"]["reread_MBps"] / out["sealed"]["reread_MBps"]
            for kind, path in paths.items():
                Expected(content, crc32c.crc32c(content)).check_files(f"{kind} segment", [path])
            # Growth: the kernel drops the pages when it sees the new size.
            tail = random.Random(SEED + 3000 + rnd).randbytes(APPEND)
            c.append(ACTIVE_SEGMENT, tail)
            self._wait_size(paths["active"], size + len(tail))
            grown = self._served_dd(paths["active"], size + len(tail))
            out["after_growth"] = {"MBps": grown["MBps"], "served_MiB": grown["served_MiB"]}
            whole = content + tail
            Expected(whole, crc32c.crc32c(whole)).check_files("grown segment", [paths["active"]])
            for name in (ACTIVE_SEGMENT, SEALED_COPY):
                c.delete(name)
        a, s = out["active"], out["sealed"]
        log(
            f"round {rnd} active segment re-read {a['reread_MBps']:.0f} MB/s, sealed "
            f"{s['reread_MBps']:.0f} MB/s ({out['ratio']:.2f}x); the daemon served "
            f"{a['reread_served_MiB']} / {s['reread_served_MiB']} MiB on the re-reads, "
            f"{grown['served_MiB']:.0f} MiB after 1 MiB of growth"
        )
        return out

    @staticmethod
    def _wait_size(path: pathlib.Path, size: int) -> None:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not path.exists() or path.stat().st_size != size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not reach {size} bytes")
            time.sleep(0.05)

    def _served_dd(self, path: pathlib.Path, size: int) -> dict[str, float]:
        """One dd of ``path`` (MB/s by dd's clock), checked; the MiB the daemon wrote meanwhile."""
        w0 = proc_io(self.daemon_pid, "wchar")
        _, own, length = dd([path])
        served = (proc_io(self.daemon_pid, "wchar") - w0) / MiB
        if length != size:
            raise AssertionError(f"dd read {length} bytes of {path}, expected {size}")
        return {"MBps": size / own / 1e6, "served_MiB": served}

    def run_boto3(self, rnd: int, latency: list[int], iops: list[int]) -> dict[str, Any]:
        assert self.storage is not None
        client, bucket = self.storage.client, self.server.bucket
        out: dict[str, Any] = {}
        weed = self.server.pid

        def get(key: str, start: int | None = None, end: int | None = None) -> bytes:
            kwargs = {} if start is None else {"Range": f"bytes={start}-{end}"}
            data: bytes = client.get_object(Bucket=bucket, Key=key, **kwargs)["Body"].read()
            return data

        drop_page_cache()
        c0 = proc_cpu(weed)
        started = time.perf_counter()
        parts = [get(c.key) for c in self.chunks]
        elapsed = time.perf_counter() - started
        out["boto3_single"] = {"MBps": self.size / elapsed / 1e6, "s3_cpu_s": proc_cpu(weed) - c0}
        self.expected.check("boto3 single", crc_all(parts), sum(map(len, parts)))
        del parts
        ranges = [
            (c.key, lo, min(c.length, lo + RAW_RANGE) - 1)
            for c in self.chunks
            for lo in range(0, c.length, RAW_RANGE)
        ]
        drop_page_cache()
        c0 = proc_cpu(weed)
        with concurrent.futures.ThreadPoolExecutor(RAW_THREADS) as pool:
            started = time.perf_counter()
            parts = list(pool.map(lambda r: get(*r), ranges))
            elapsed = time.perf_counter() - started
        out["boto3_parallel"] = {
            "MBps": self.size / elapsed / 1e6,
            "s3_cpu_s": proc_cpu(weed) - c0,
        }
        self.expected.check("boto3 parallel", crc_all(parts), sum(map(len, parts)))
        del parts
        log(
            f"round {rnd} boto3: one GET per chunk {out['boto3_single']['MBps']:.0f} MB/s, "
            f"{RAW_THREADS}x{RAW_RANGE >> 20} MiB ranges {out['boto3_parallel']['MBps']:.0f} MB/s"
        )

        def get_page(offset: int) -> bytes:
            c = self.chunk_of(offset)
            at = offset - c.start
            data = get(c.key, at, at + PAGE - 1)
            if data != self.expected.content[offset : offset + PAGE]:
                raise AssertionError(f"4 KiB GET of {c.key} at {at} returned the wrong bytes")
            return data

        drop_page_cache()
        samples = []
        for offset in latency:
            started = time.perf_counter()
            get_page(offset)
            samples.append((time.perf_counter() - started) * 1e3)
        out["first_byte_ms"] = samples
        drop_page_cache()
        out["iops"] = random_iops(get_page, iops, self.expected)
        log(
            f"round {rnd} boto3 first byte p50 {statistics.median(samples):.1f} ms, "
            f"4 KiB random {out['iops']['iops']:.0f} IOPS"
        )
        return out

    def run_local(self, rnd: int, latency: list[int], iops: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        drop_page_cache()
        out["local_cold"] = self.timed_dd([self.local])
        out["local_warm"] = self.warm_dd([self.local])
        drop_page_cache()
        out["first_byte_ms"] = first_byte(self.local_locate, latency, self.expected)
        drop_page_cache()
        out["iops"] = file_iops(self.local_locate, iops, self.expected)
        log(
            f"round {rnd} local: cold {out['local_cold']['MBps']:.0f} MB/s, warm "
            f"{out['local_warm']['MBps']:.0f} MB/s, first byte "
            f"{statistics.median(out['first_byte_ms']):.2f} ms, "
            f"{out['iops']['iops']:.0f} IOPS"
        )
        return out


def crc_all(parts: list[bytes]) -> int:
    crc = 0
    for p in parts:
        crc = crc32c.crc32c(p, crc)
    return crc


def du(path: pathlib.Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- driving the rounds ---------------------------------------------------------------------


def run(
    bench: Bench, repeat: int, parts: tuple[str, ...] = PARTS, active_size: int = 256 * MiB
) -> dict[str, Any]:
    seq: dict[str, list[dict[str, float]]] = {}
    active: list[dict[str, Any]] = []
    first: dict[str, list[float]] = {}
    iops: dict[str, list[dict[str, float]]] = {}
    warming: list[dict[str, float]] = []
    for rnd in range(repeat):
        latency, iops_offsets = random_offsets(bench.size, rnd)
        rclone_off = functools.partial(bench.rclone_mount, "off")
        rclone_full = functools.partial(bench.rclone_mount, "full")
        systems: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("ours", functools.partial(bench.run_ours, rnd, latency, iops_offsets)),
            (
                "s3fs",
                functools.partial(
                    bench.run_peer, "s3fs", bench.s3fs_mount, rnd, latency, iops_offsets
                ),
            ),
            (
                "rclone_off",
                functools.partial(
                    bench.run_peer, "rclone_off", rclone_off, rnd, latency, iops_offsets
                ),
            ),
            (
                "rclone_full",
                functools.partial(bench.run_peer, "rclone_full", rclone_full, rnd, None, None),
            ),
            ("boto3", functools.partial(bench.run_boto3, rnd, latency, iops_offsets)),
            ("local", functools.partial(bench.run_local, rnd, latency, iops_offsets)),
            ("active", functools.partial(bench.run_active, rnd, active_size)),
        ]
        systems = [(name, fn) for name, fn in systems if name in parts]
        # Rotate the order, so that no system always runs first or after another.
        k = rnd % len(systems)
        for name, fn in systems[k:] + systems[:k]:
            out = fn()
            for mode in SEQ_MODES:
                if mode in out:
                    seq.setdefault(mode, []).append(out[mode])
            if "first_byte_ms" in out:
                first.setdefault(name, []).extend(out["first_byte_ms"])
                iops.setdefault(name, []).append(out["iops"])
            if "warming" in out:
                warming.append(out["warming"])
            if name == "active":
                active.append(out)
    sequential: dict[str, dict[str, Any]] = {}
    for mode, runs in seq.items():
        sequential[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        sequential[mode]["runs"] = [r["MBps"] for r in runs]
    random_reads = {
        name: {
            "first_byte_p50_ms": statistics.median(first[name]),
            "first_byte_max_ms": max(first[name]),
            "first_byte_samples": len(first[name]),
            "iops": statistics.median(r["iops"] for r in iops[name]),
            "iops_runs": [r["iops"] for r in iops[name]],
            "reads_per_run": [r["reads"] for r in iops[name]],
        }
        for name in RANDOM_SYSTEMS
        if name in first
    }
    result = {"sequential": sequential, "random_4k": random_reads, "warming": warming}
    if active:
        result["active_segment"] = {
            "size": active_size,
            "reread_vs_sealed": statistics.median(r["ratio"] for r in active),
            "ratio_runs": [r["ratio"] for r in active],
            "rounds": active,
        }
    return result


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets a full run measures (a run of some --parts: the random-read ratios only)."""
    out = random_targets(result)
    if any(m not in result["sequential"] for m in SEQ_MODES):
        return out
    return {**_sequential_targets(result), **out}


def random_targets(result: dict[str, Any]) -> dict[str, Any]:
    """Ours against boto3's 4 KiB ranged GETs, and the active segment's re-read ratio."""
    out: dict[str, Any] = {}
    r = result["random_4k"]
    if "ours" in r and "boto3" in r:
        out["random_iops_vs_boto3"] = {
            "value": r["ours"]["iops"] / r["boto3"]["iops"], "target": TARGET_IOPS_VS_BOTO3,
        }  # fmt: skip
        out["first_byte_vs_boto3"] = {
            "value": r["ours"]["first_byte_p50_ms"] / r["boto3"]["first_byte_p50_ms"],
            "target_at_most": TARGET_FIRST_BYTE_VS_BOTO3,
        }
        out["random_iops_vs_boto3"]["met"] = (
            out["random_iops_vs_boto3"]["value"] >= TARGET_IOPS_VS_BOTO3
        )
        out["first_byte_vs_boto3"]["met"] = (
            out["first_byte_vs_boto3"]["value"] <= TARGET_FIRST_BYTE_VS_BOTO3
        )
    a = result.get("active_segment")
    if a is not None:
        out["active_reread_vs_sealed"] = {
            "value": a["reread_vs_sealed"],
            "target": TARGET_ACTIVE_VS_SEALED,
            "met": a["reread_vs_sealed"] >= TARGET_ACTIVE_VS_SEALED,
        }
    return out


def _sequential_targets(result: dict[str, Any]) -> dict[str, Any]:
    s = {k: v["MBps"] for k, v in result["sequential"].items()}
    cold = s["ours_cold"]
    checks = {
        "cold_vs_s3fs": (cold / s["s3fs"], TARGET_COLD_VS_S3FS),
        "cold_vs_rclone_off": (cold / s["rclone_off"], TARGET_COLD_VS_RCLONE),
        # Paired: the local file read in the same seconds, median of the rounds' ratios.
        "warm_vs_local_warm": (result["sequential"]["ours_warm"]["vs_local"], TARGET_WARM_VS_LOCAL),
        "rocksdb_warm_MBps": (s["ours_rocksdb"], TARGET_ROCKSDB_MBPS),
    }
    out: dict[str, Any] = {
        k: {"value": v, "target": t, "met": v >= t} for k, (v, t) in checks.items()
    }
    out["informational"] = {
        "cold_vs_boto3_single": cold / s["boto3_single"],
        "cold_vs_boto3_parallel": cold / s["boto3_parallel"],
        "cold_vs_rclone_full": cold / s["rclone_full"],
        "rocksdb_warm_vs_local_cold": s["ours_rocksdb"] / s["local_cold"],
        "rocksdb_warm_in_page_cache_MBps": s["ours_rocksdb_mem"],
    }
    return out


# -- the report ----------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _sizes(mib: list[float]) -> str:
    if min(mib) == max(mib):
        return f"{mib[0]:.0f} MiB each"
    return f"{min(mib):.0f}-{max(mib):.0f} MiB"


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    s, t = result["sequential"], result["targets"]
    info = t["informational"]
    size = result["size"]
    cold = s["ours_cold"]["MBps"]
    sizes = result["chunk_sizes_MiB"]
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, a {size >> 20} MiB sealed segment in "
        f"{len(sizes)} chunk objects ({_sizes(sizes)}) on the embedded "
        f"SeaweedFS (same disk), median of {result['repeat']} rounds; software "
        f"{result['version']} ({result['source']}); {result['peers']}.",
        "",
        "Sequential reads, `dd bs=1M`:",
        "",
        "| read | MB/s | runs min–max | ratio | target |",
        "|---|---|---|---|---|",
    ]
    ratios = {
        "ours_cold": (
            f"{t['cold_vs_s3fs']['value']:.2f}× s3fs-fuse, "
            f"{t['cold_vs_rclone_off']['value']:.2f}× rclone (off), "
            f"{info['cold_vs_boto3_single']:.2f}× boto3 GETs",
            f"≥ {TARGET_COLD_VS_S3FS}× s3fs-fuse: {_met(t['cold_vs_s3fs']['met'])}; "
            f"≥ {TARGET_COLD_VS_RCLONE}× rclone (off): {_met(t['cold_vs_rclone_off']['met'])}",
        ),
        "ours_warm": (
            f"{t['warm_vs_local_warm']['value']:.2f}× local file (page cache, read "
            f"alternately with it: {s['ours_warm']['local_MBps']:.0f} MB/s)",
            f"≥ {TARGET_WARM_VS_LOCAL}×: {_met(t['warm_vs_local_warm']['met'])}",
        ),
        "ours_rocksdb": (
            f"{info['rocksdb_warm_vs_local_cold']:.2f}× local file (page cache dropped)",
            f"≥ {TARGET_ROCKSDB_MBPS / 1000:.0f} GB/s: {_met(t['rocksdb_warm_MBps']['met'])}",
        ),
        "ours_rocksdb_mem": (
            f"{info['rocksdb_warm_in_page_cache_MBps'] / TARGET_ROCKSDB_MBPS:.2f}× 1 GB/s",
            "(not a target)",
        ),
    }
    for mode, label in SEQ_MODES.items():
        if mode not in s:
            continue
        row = s[mode]
        ratio, target = ratios.get(mode, (f"ours cold is {cold / row['MBps']:.2f}× this", ""))
        if mode.startswith("local"):
            ratio = ""
        lines.append(
            f"| {label} | {row['MBps']:.0f} | {min(row['runs']):.0f}–{max(row['runs']):.0f} "
            f"| {ratio} | {target} |"
        )
    oc, orx, orm = s["ours_cold"], s["ours_rocksdb"], s["ours_rocksdb_mem"]
    lines += [
        "",
        f"Per {size >> 20} MiB read (medians): cold, the daemon used {oc['daemon_cpu_s']:.1f} s "
        f"of CPU and SeaweedFS {oc['s3_cpu_s']:.1f} s (s3fs-fuse's read: SeaweedFS "
        f"{s['s3fs']['s3_cpu_s']:.1f} s); RocksDB warm, the daemon used "
        f"{orx['daemon_cpu_s']:.1f} s and read {orx['daemon_disk_read_MiB']:.0f} MiB from the "
        f"disk ({orm['daemon_cpu_s']:.1f} s and {orm['daemon_disk_read_MiB']:.0f} MiB with "
        f"RocksDB's files in the page cache), SeaweedFS sent nothing (it wrote "
        f"{orx['s3_wrote_MiB']:.1f} MiB in all; cache directory {orx['cache_dir_MiB']:.0f} MiB).",
        "",
        f"Random 4 KiB reads from a cold state, {IOPS_THREADS} threads, each read in a "
        f"different MiB ({IOPS_READS} reads or {IOPS_SECONDS:.0f} s per round); first byte = "
        f"`open` + the first 4 KiB `pread` ({LATENCY_SAMPLES} per round, median of all):",
        "",
        "| system | first byte p50 ms | max ms | 4 KiB random IOPS | runs min–max |",
        "|---|---|---|---|---|",
    ]
    for name, label in RANDOM_SYSTEMS.items():
        r = result["random_4k"].get(name)
        if r is None:
            continue
        lines.append(
            f"| {label} | {r['first_byte_p50_ms']:.2f} | {r['first_byte_max_ms']:.2f} "
            f"| {r['iops']:.0f} | {min(r['iops_runs']):.0f}–{max(r['iops_runs']):.0f} |"
        )
    verdicts = [
        f"cold ≥ {TARGET_COLD_VS_S3FS}× s3fs-fuse — {t['cold_vs_s3fs']['value']:.2f}× "
        f"({_met(t['cold_vs_s3fs']['met'])})",
        f"cold ≥ {TARGET_COLD_VS_RCLONE}× rclone (cache off) — "
        f"{t['cold_vs_rclone_off']['value']:.2f}× ({_met(t['cold_vs_rclone_off']['met'])})",
        f"page-cache warm ≥ {TARGET_WARM_VS_LOCAL}× the local file (page cache) — "
        f"{t['warm_vs_local_warm']['value']:.2f}× ({_met(t['warm_vs_local_warm']['met'])})",
        f"RocksDB warm ≥ 1 GB/s — {t['rocksdb_warm_MBps']['value']:.0f} MB/s "
        f"({_met(t['rocksdb_warm_MBps']['met'])}; {info['rocksdb_warm_in_page_cache_MBps']:.0f} "
        "MB/s with RocksDB's files in the page cache)",
    ]
    lines += ["", "Targets: " + "; ".join(verdicts) + ".", TABLE_END]
    text = path.read_text()
    if TABLE_START not in text:
        path.write_text(
            text.rstrip("\n") + f"\n\n{SECTION_HEADING}\n\n{TABLE_START}\n{TABLE_END}\n"
        )
    replace_table(path, TABLE_START, TABLE_END, lines)


def source_version() -> str:
    """The commit the daemon runs, and whether its code has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "gateway", "fs", "cache"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    return f"commit {commit}" + (" with uncommitted changes" if changed else "")


def peer_versions(bench: Bench) -> str:
    if not bench.s3fs:
        return "no FUSE peers run"
    s3fs = subprocess.run([bench.s3fs, "--version"], capture_output=True, text=True).stdout
    rclone = subprocess.run([bench.rclone, "version"], capture_output=True, text=True).stdout
    s3fs_v = s3fs.split("V", 1)[1].split()[0] if "V" in s3fs else "?"
    rclone_v = rclone.split()[1] if rclone.split() else "?"
    return f"s3fs {s3fs_v}, rclone {rclone_v}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=pathlib.Path, default=pathlib.Path("/var/tmp"),
        help="where the work directory (S3 data, cache, mounts) is made (default /var/tmp)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--size", type=int, default=1 * GiB, help="segment bytes (default 1 GiB)")
    parser.add_argument("--write-table", type=pathlib.Path, metavar="PERFORMANCE.md")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 round, 256 MiB")
    parser.add_argument(
        "--parts", default=",".join(PARTS),
        help=f"comma-separated systems to run (default all: {','.join(PARTS)})",
    )  # fmt: skip
    parser.add_argument(
        "--active-size", type=int, default=256 * MiB,
        help="bytes of each segment of the active-segment case (default 256 MiB)",
    )  # fmt: skip
    args = parser.parse_args()
    parts = tuple(p for p in args.parts.split(",") if p)
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown --parts {unknown}; choose from {','.join(PARTS)}")
    if args.write_table and set(parts) != set(PARTS):
        parser.error("--write-table needs a full run (every part)")
    if args.quick:
        args.repeat, args.size = 1, 256 * MiB
    size = max(args.size // MiB, LATENCY_SAMPLES + 1) * MiB
    if os.geteuid() != 0:
        raise SystemExit("bench/fuse_read.py needs root: it drops the page cache and mounts")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    args.dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=args.dir, prefix="fuse-read-"))
    result: dict[str, Any] = {
        "benchmark": "fuse_read",
        "version": __version__,
        "source": source_version(),
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "repeat": args.repeat,
        "quick": args.quick,
        "size": size,
        "iops_threads": IOPS_THREADS,
        "iops_reads": IOPS_READS,
        "latency_samples_per_round": LATENCY_SAMPLES,
        "parts": list(parts),
    }
    bench = Bench(work, size)
    try:
        bench.start(peers=bool({"s3fs", "rclone_off", "rclone_full"} & set(parts)))
        result["peers"] = peer_versions(bench)
        bench.build()
        result["chunks"] = len(bench.chunks)
        result["chunk_sizes_MiB"] = [c.length / MiB for c in bench.chunks]
        active_size = min(args.active_size // MiB, size // MiB) * MiB
        result.update(run(bench, args.repeat, parts, active_size))
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = targets(result)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
