"""bench/fuse_read.py's systems under test: our daemon and mount, s3fs-fuse, rclone
mount, boto3 and a local file, over one embedded S3 server (`Bench`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c
from common import (
    drop_page_cache,
    ensure_rclone,
    ensure_s3fs,
    log,
    running_daemon,
    terminate,
    wait_for_segment_files,
    wait_mounted,
)
from fuse_read_measure import (
    PAGE,
    SEED,
    Expected,
    MiB,
    crc_of,
    dd,
    file_iops,
    find_pid,
    first_byte,
    is_mounted,
    lazy_unmount,
    proc_cpu,
    proc_io,
    random_iops,
)

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import SegmentNotFound
from gateway.storage.s3 import S3Storage

SEGMENT = "bench/seg"
PREFIX = "gw"
NODE = "node-1"
APPEND = 1 * MiB
CHUNK_SIZE = 64 * MiB
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
#: Page-cache reads of a file per round (their median counts).
WARM_DDS = 3
#: Time for the daemon's background cache writes to finish after warming.
CACHE_SETTLE = 2.0

#: Labels of the sequential modes, in table order.
SEQ_MODES = {
    "ours_cold": "ours, daemon path (passthrough off), cold (cache wiped, page cache dropped)",
    "ours_warm": "ours, daemon path, page cache warm",
    "ours_rocksdb": "ours, daemon path, RocksDB warm (page cache dropped, daemon restarted)",
    "ours_rocksdb_mem": "ours, daemon path, RocksDB warm, its files in the page cache "
    "(daemon restarted)",
    "s3fs": "s3fs-fuse (defaults, no disk cache)",
    "rclone_off": "rclone mount, --vfs-cache-mode off",
    "rclone_full": "rclone mount, --vfs-cache-mode full (empty cache)",
    "boto3_single": "boto3, one GET per chunk object, in turn",
    "boto3_parallel": f"boto3, {RAW_THREADS} threads × {RAW_RANGE >> 20} MiB ranged GETs",
    "local_cold": "local file, page cache dropped",
    "local_warm": "local file, page cache warm",
    "cfuse_cold": "C FUSE: libfuse's passthrough_ll (cache=always) over the local file, "
    "page cache dropped",
    "cfuse_warm": "C FUSE: the same, page cache warm",
    "passthrough_cold": "ours, FUSE passthrough from the segment file, page cache dropped",
    "passthrough_warm": "ours, FUSE passthrough, page cache warm",
    "first_read_on": "ours, first read of a sealed segment, cold (cache and segment files "
    "wiped, page cache dropped), passthrough on",
    "first_read_off": "ours, the same with passthrough = false",
    "second_read_on": "ours, the read after a first full read (passthrough on; page cache dropped)",
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
PARTS = (
    "ours", "s3fs", "rclone_off", "rclone_full", "boto3", "local", "cfuse", "passthrough",
    "first_read", "active",
)  # fmt: skip


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
        #: libfuse's passthrough_ll example, built from this machine's libfuse3-dev.
        self.passthrough_ll = ""
        self.cfuse_mnt = work / "cfuse-mnt"
        self.daemon_pid: int | None = None
        #: ``[fuse] passthrough`` of the daemons started from now on.
        self.passthrough = True

    # -- set-up

    def start(self, peers: bool = True, cfuse: bool = True) -> None:
        if peers:
            self.s3fs = ensure_s3fs()
            self.rclone = ensure_rclone()
        if cfuse:
            from passthrough_probe import build_system_passthrough_ll

            built = self.work / "cfuse-build"
            built.mkdir()
            ll, version = build_system_passthrough_ll(built)
            self.passthrough_ll = str(ll)
            log(f"built passthrough_ll (libfuse {version})")
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
        for path in (self.peer_mnt, self.mnt, self.cfuse_mnt):
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
            f"[fuse]\npassthrough = {str(self.passthrough).lower()}\n"
        )

    @contextlib.contextmanager
    def daemon(self, wipe_cache: bool, has_segment: bool = True) -> Iterator[str]:
        """The daemon with the segments mounted at `mnt`; its cache deleted first if asked.

        With ``has_segment``, wait until the mount shows the segment.
        """
        if wipe_cache:
            # Every local copy: RocksDB's and the segment files passthrough reads.
            shutil.rmtree(self.data_dir / "cache", ignore_errors=True)
            shutil.rmtree(self.data_dir / "segment-files", ignore_errors=True)
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
        """The daemon's own read path (passthrough off: once a segment file exists the
        kernel reads it instead, which is part ``passthrough``)."""
        saved, self.passthrough = self.passthrough, False
        try:
            return self._run_ours(rnd, latency, iops)
        finally:
            self.passthrough = saved

    def _run_ours(self, rnd: int, latency: list[int], iops: list[int]) -> dict[str, Any]:
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
            wait_mounted(proc, lambda: is_mounted(self.peer_mnt), name, log_path, MOUNT_TIMEOUT)
            deadline = time.monotonic() + MOUNT_TIMEOUT
            # Mounted is not yet answering: wait until the first chunk is visible.
            while not self.peer_files()[0].exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: {self.peer_files()[0]} did not appear")
                time.sleep(0.1)
            yield
        finally:
            lazy_unmount(self.peer_mnt)
            terminate(proc)

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

    def run_cfuse(self, rnd: int) -> dict[str, Any]:
        """The local file through a minimal C FUSE file system (the kernel's FUSE read
        path with a daemon that only ``pread``s), cold and warm: what any FUSE
        daemon on this kernel reaches, the baseline of the RocksDB-warm read.
        """
        self.cfuse_mnt.mkdir(exist_ok=True)
        command = [self.passthrough_ll, "-f", "-o", f"cache=always,source={self.local.parent}",
                   str(self.cfuse_mnt)]  # fmt: skip
        out: dict[str, Any] = {}
        log_path = self.work / "cfuse.log"
        with open(log_path, "wb") as sink:
            proc = subprocess.Popen(command, stdout=sink, stderr=sink, start_new_session=True)
        try:
            wait_mounted(proc, lambda: is_mounted(self.cfuse_mnt), "passthrough_ll", log_path,
                         MOUNT_TIMEOUT, interval=0.02)  # fmt: skip
            path = [self.cfuse_mnt / self.local.name]
            self.daemon_pid = proc.pid
            drop_page_cache()
            out["cfuse_cold"] = self.timed_dd(path)
            out["cfuse_warm"] = self.warm_dd(path)
            self.expected.check("passthrough_ll", *crc_of(path))
        finally:
            self.daemon_pid = None
            lazy_unmount(self.cfuse_mnt)
            terminate(proc)
        log(
            f"round {rnd} C FUSE: cold {out['cfuse_cold']['MBps']:.0f} MB/s, warm "
            f"{out['cfuse_warm']['MBps']:.0f} MB/s ({out['cfuse_warm']['vs_local']:.2f}× the "
            "local file read alternately)"
        )
        return out


#: How long a segment file may take to appear after the read that asks for it.
FILE_TIMEOUT = 600.0


def run_passthrough(bench: Bench, rnd: int) -> dict[str, Any]:
    """Ours once the segment has its segment file: the kernel reads it (FUSE passthrough).

    A first read through the mount (served by the daemon) has the file made;
    once it is in place a new open is a passthrough open. Cold and warm as
    for the local file; the daemon's CPU shows it served nothing.
    """
    seg = [bench.mnt / SEGMENT]
    files = bench.data_dir / "segment-files"
    out: dict[str, Any] = {}
    with bench.daemon(wipe_cache=False):
        if not wait_for_segment_files(bench.data_dir, 1, 0):
            dd(seg)
            if not wait_for_segment_files(bench.data_dir, 1, FILE_TIMEOUT):
                raise RuntimeError(f"no segment file appeared in {files}")
        drop_page_cache()
        out["passthrough_cold"] = r = bench.timed_dd(seg)
        out["passthrough_warm"] = w = bench.warm_dd(seg)
        bench.expected.check_files("ours, passthrough", seg)
    log(
        f"round {rnd} passthrough: cold {r['MBps']:.0f} MB/s (daemon CPU "
        f"{r['daemon_cpu_s']:.2f} s), warm {w['MBps']:.0f} MB/s ({w['vs_local']:.2f}x the "
        "local file read alternately)"
    )
    return out


def run_first_read(bench: Bench, rnd: int) -> dict[str, Any]:
    """The first read of the sealed segment with passthrough on against off, cold.

    First a 4 KiB read (fresh daemon, cache wiped) and what SeaweedFS sends
    in the next seconds. Then each: the cache and the segment files wiped, a fresh daemon, the page
    cache dropped, one dd (the order alternates from round to round). With
    passthrough on, the segment file is made once the daemon has served all
    of the segment; then a second dd (page cache dropped) must be served by
    the kernel from it: the daemon writes no reply (``wchar``) meanwhile.
    """
    seg = [bench.mnt / SEGMENT]
    files = bench.data_dir / "segment-files"
    out: dict[str, Any] = {}
    for on in (True, False) if rnd % 2 == 0 else (False, True):
        shutil.rmtree(files, ignore_errors=True)
        bench.passthrough = on
        try:
            with bench.daemon(wipe_cache=True):
                out[f"partial_{'on' if on else 'off'}"] = r = partial_read(bench, files)
                log(
                    f"round {rnd} 4 KiB read, passthrough {on}: SeaweedFS wrote "
                    f"{r['s3_wrote_MiB']:.1f} MiB in {PARTIAL_WATCH:.0f} s, segment file: "
                    f"{r['segment_file']}"
                )
            with bench.daemon(wipe_cache=True):
                drop_page_cache()
                out[f"first_read_{'on' if on else 'off'}"] = r = bench.timed_dd(seg)
                bench.expected.check_files("ours, first read", seg)
                log(f"round {rnd} first read, passthrough {on}: {r['MBps']:.0f} MB/s")
                if not on:
                    continue
                made = time.monotonic()
                if not wait_for_segment_files(bench.data_dir, 1, FILE_TIMEOUT):
                    raise RuntimeError(f"no segment file appeared in {files}")
                out["file_made_after_s"] = time.monotonic() - made
                drop_page_cache()
                w0 = proc_io(bench.daemon_pid, "wchar")
                out["second_read_on"] = r = bench.timed_dd(seg)
                r["daemon_wrote_MiB"] = (proc_io(bench.daemon_pid, "wchar") - w0) / MiB
                bench.expected.check_files("ours, second read", seg)
                log(
                    f"round {rnd} second read: {r['MBps']:.0f} MB/s, the daemon wrote "
                    f"{r['daemon_wrote_MiB']:.2f} MiB (file made "
                    f"{out['file_made_after_s']:.1f} s after the first read)"
                )
        finally:
            bench.passthrough = True
    out["ratios"] = {
        "first_read_on_vs_off": out["first_read_on"]["MBps"] / out["first_read_off"]["MBps"]
    }
    return out


#: Seconds the 4 KiB read's aftermath is watched (a copy of the segment would show).
PARTIAL_WATCH = 5.0


def partial_read(bench: Bench, files: pathlib.Path) -> dict[str, Any]:
    """``head -c 4096`` of the cold segment; what SeaweedFS sends in the next seconds."""
    drop_page_cache()
    w0 = proc_io(bench.server.pid, "wchar")
    with open(bench.mnt / SEGMENT, "rb", buffering=0) as f:
        if f.read(4096) != bench.expected.content[:4096]:
            raise AssertionError("the first 4 KiB through the mount differ")
    time.sleep(PARTIAL_WATCH)
    return {
        "s3_wrote_MiB": (proc_io(bench.server.pid, "wchar") - w0) / MiB,
        "segment_file": any(files.glob("[0-9]*")),
    }


def crc_all(parts: list[bytes]) -> int:
    crc = 0
    for p in parts:
        crc = crc32c.crc32c(p, crc)
    return crc


def du(path: pathlib.Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
