"""bench/fuse_read.py's measuring tools: the machine (process counters, mounts), dd,
checked reads, first-byte latency and 4 KiB random-read IOPS."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import crc32c

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
SEED = 20261122
PAGE = 4 * KiB
LATENCY_SAMPLES = 10
IOPS_READS = 200
IOPS_THREADS = 4
IOPS_SECONDS = 10.0
DD_TIMEOUT = 900.0


# -- the machine ------------------------------------------------------------------------


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
