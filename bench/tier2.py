#!/usr/bin/env python3
"""Tier-2 benchmark: ingest with flushing on, ack-to-S3 latency, cold reads from chunks.

One embedded S3 server (SeaweedFS, `gateway.embedded.EmbeddedS3`) runs
for the whole benchmark, its data in a temporary directory on the same
filesystem as the journals and caches (--dir). The container runs in this
process, as in the tests: ``open_node(config, ChunkLayer(S3Storage(...)))``.
Every run gets a fresh data directory (journal and cache) and, where it
writes chunks, a fresh bucket (deleted afterwards).

1. **Sustained ingest with flushing on.** Several appenders (closed loop, each
   awaits its ack) append 64 KiB or 1 MiB pieces to several segments until a
   fixed number of bytes is acknowledged; Tier 2 has its default settings
   (flush_size 8 MiB, max_chunk_size 64 MiB, flush_interval 10 s). A task
   samples the unflushed backlog (length - storage_length, all segments)
   every 10 ms. After the last ack: the time until the policy is satisfied
   (every segment below flush_size), then an explicit ``flush`` of the rest.
   Baseline, alternated with it round by round: the same ingest with Tier 2
   off (``open_node(config)``). The cache budget (8 GiB, half of it for
   unflushed data) is large enough that the baseline, which keeps
   everything pinned, is never throttled. Target: ≥ 0.9 times the baseline.
2. **Ack to "in S3" latency.** A modest rate of appends; every append's
   acknowledgement time is noted, and a task polling ``container.info`` every
   5 ms notes when the storage length first covers it. Two cases: 1 KiB
   appends with flush_interval lowered to 1 s (the interval dominates, by
   design), and appends of flush_size (8 MiB) each, so that each one is
   flushed at once (upload-bound).
3. **Cold sequential read.** One segment of --read-size bytes (1 MiB
   appends) is flushed, the container closed; every run deletes the cache
   directory, reopens, and reads the segment with ``container.read`` (the
   read path of the FUSE mount) in 1 MiB and 128 KiB pieces, with the
   default read_ahead (32) and others. Baselines on the same server, the
   same bytes uploaded as one object: one boto3 ``get_object`` reading the
   whole body, and 8 threads doing ranged GETs of 8 MiB. Runs interleave;
   every read is checked byte-exact (CRC32C: incremental in the timed loop
   of the gateway reads, after the clock for the baselines). Target: the
   best gateway read ≥ 0.8 times the best raw baseline.

Prints one JSON document (progress on stderr); with --write-table also
rewrites the Tier-2 section of docs/PERFORMANCE.md. --quick (1 round, 256 MiB
segments) checks that it works end to end in about a minute.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import pathlib
import random
import shutil
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator
from functools import partial
from typing import Any

import crc32c
import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    argument_parser,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    stop_on_signals,
    work_directory,
)

from gateway.config import Config  # noqa: E402
from gateway.container.container import SegmentContainer  # noqa: E402
from gateway.embedded import EmbeddedS3  # noqa: E402
from gateway.errors import Overloaded  # noqa: E402
from gateway.node import open_node  # noqa: E402
from gateway.read.chunks import BLOCK_SIZE  # noqa: E402
from gateway.storage.layer import ChunkLayer  # noqa: E402
from gateway.storage.s3 import S3Storage  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TABLE_START = "<!-- bench/tier2.py:start -->"
TABLE_END = "<!-- bench/tier2.py:end -->"
TARGET_INGEST_RATIO = 0.9
TARGET_READ_RATIO = 0.8
#: Backlog growth (share of the ingest rate) below which flushing counts as keeping up.
KEEPS_UP_GROWTH = 0.05

#: Large enough that the no-Tier-2 baseline (everything stays pinned) is never throttled.
CACHE_BUDGET = 8 * GiB
PINNED_SHARE = 0.5
#: Ingest: (append size, bytes per run in full mode); appenders and segments.
INGEST_CASES = [(64 * KiB, 1 * GiB), (1 * MiB, 2 * GiB)]
INGEST_APPENDERS = 8
INGEST_SEGMENTS = 4
BACKLOG_SAMPLE = 0.01
#: Ack -> in S3: (label, append size, appends/s in all, segments, flush_interval).
LATENCY_CASES = [
    ("1 KiB appends, flush_interval 1 s", 1 * KiB, 400.0, 4, 1.0),
    ("8 MiB appends (= flush_size)", 8 * MiB, 8.0, 4, 10.0),
]
LATENCY_POLL = 0.005
#: Cold reads: (read size, read_ahead, max_concurrency).
READ_VARIANTS = [
    (1 * MiB, 32, 8),  # the defaults
    (1 * MiB, 8, 8),
    (128 * KiB, 32, 8),
]
DEFAULT_READ_VARIANT = (1 * MiB, 32, 8)
RAW_THREADS = 8
RAW_RANGE = 8 * MiB
READ_SEGMENT = "bench/cold"
RAW_KEY = "raw/cold.bin"


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def make_config(data_dir: pathlib.Path, **tier2: Any) -> Config:
    """Daemon defaults but for the cache budget (and what ``tier2`` overrides)."""
    return Config.from_dict(
        {
            "node": {"data_dir": str(data_dir)},
            "cache": {"budget": CACHE_BUDGET, "pinned_share": PINNED_SHARE},
            "tier2": tier2,
        }
    )


class Tier2Server:
    """The benchmark's SeaweedFS, and S3 bindings on fresh buckets of it."""

    def __init__(self, data_dir: pathlib.Path) -> None:
        self.server = EmbeddedS3(data_dir)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def storage(self, bucket: str, connections: int = 8) -> S3Storage:
        """An `S3Storage` on ``bucket`` (created if missing), as `open_tier2` makes it."""
        s = self.server
        storage = S3Storage(
            bucket,
            endpoint_url=s.endpoint_url,
            max_pool_connections=connections,
            timeout=30.0,
            access_key=s.access_key,
            secret_key=s.secret_key,
        )
        storage.create_bucket_if_missing()
        return storage

    def layer(self, storage: S3Storage, config: Config) -> ChunkLayer:
        """The layer `open_tier2` builds for the embedded server (syncfs barrier included)."""
        return ChunkLayer(
            storage,
            max_concurrency=config.tier2.max_concurrency,
            retry_deadline=config.tier2.retry_deadline,
            barrier=self.server.sync,
        )

    @contextlib.contextmanager
    def bucket(self, connections: int = 8) -> Iterator[S3Storage]:
        """A fresh bucket for one run, deleted with its objects afterwards."""
        storage = self.storage(f"bench-{uuid.uuid4().hex[:12]}", connections)
        try:
            # A new bucket is a new SeaweedFS collection: its first write waits
            # for a volume to grow (0.2-1 s). Not what the runs should measure.
            storage.write(".warm-up", b"ok", {})
            storage.delete(".warm-up")
            yield storage
        finally:
            # SeaweedFS deletes a bucket with its objects (and frees its volumes).
            with contextlib.suppress(Exception):
                storage.client.delete_bucket(Bucket=storage.bucket)
            storage.close()


# -- 1. sustained ingest -------------------------------------------------------------


def _backlog(c: SegmentContainer, names: list[str]) -> int:
    total = 0
    for n in names:
        info = c.info(n)
        total += info.length - info.storage_length
    return total


async def run_ingest(
    config: Config,
    server: Tier2Server,
    storage: S3Storage | None,
    append_size: int,
    total: int,
) -> dict[str, float]:
    """Appenders append ``append_size`` pieces until ``total`` bytes are acknowledged."""
    layer = server.layer(storage, config) if storage is not None else None
    names = [f"bench/ingest-{k}" for k in range(INGEST_SEGMENTS)]
    rng = random.Random(append_size)
    pieces = [rng.randbytes(append_size) for _ in range(16)]
    per_appender = total // INGEST_APPENDERS // append_size
    perf = time.perf_counter
    latencies: list[float] = []
    backlog_max = 0
    #: (time, unflushed bytes of all segments), every `BACKLOG_SAMPLE` seconds.
    backlog: list[tuple[float, int]] = []
    overloaded = 0
    flush_size = config.tier2.flush_size
    async with open_node(config, layer) as node:
        c = node.container
        for n in names:
            await (await c.admit(partial(c.prepare_create, n), 1024)).wait()

        async def appender(k: int) -> None:
            nonlocal overloaded
            name = names[k % INGEST_SEGMENTS]
            i = 0
            while i < per_appender:
                data = pieces[(k + i) % len(pieces)]
                t = perf()
                try:
                    op = await c.admit(partial(c.prepare_append, name, data), len(data) + 1024)
                    await op.wait()
                except Overloaded:
                    overloaded += 1
                    continue
                latencies.append(perf() - t)
                i += 1

        async def sample_backlog() -> None:
            nonlocal backlog_max
            while True:
                now = _backlog(c, names)
                backlog.append((perf(), now))
                backlog_max = max(backlog_max, now)
                await trio.sleep(BACKLOG_SAMPLE)

        drain_policy = drain_all = float("nan")
        async with trio.open_nursery() as outer:
            if layer is not None:
                outer.start_soon(sample_backlog)
            started = perf()
            async with trio.open_nursery() as nursery:
                for k in range(INGEST_APPENDERS):
                    nursery.start_soon(appender, k)
            last_ack = perf()
            backlog_end = _backlog(c, names)
            if layer is not None:
                # What the policy flushes by itself: everything but each
                # segment's last < flush_size (that waits for flush_interval).
                while any(  # noqa: ASYNC110 - polls state that has no event
                    c.info(n).length - c.info(n).storage_length >= flush_size for n in names
                ):
                    await trio.sleep(LATENCY_POLL)
                drain_policy = perf() - last_ack
                await c.flush()
                drain_all = perf() - last_ack
                assert _backlog(c, names) == 0
            outer.cancel_scope.cancel()
        writer = node.storage_writer
        flushed = writer.statistics() if writer is not None else None
        journal_files = c.statistics()["journal_files_in_use"]
    elapsed = last_ack - started
    acked = len(latencies) * append_size
    latencies.sort()
    # Keeping up = a bounded backlog: its trend over the second half of the run.
    late = [(t, b) for t, b in backlog if started + elapsed / 2 <= t <= last_ack]
    growth = float("nan")
    if len(late) >= 2:
        growth = statistics.linear_regression([t for t, _ in late], [b for _, b in late]).slope
    return {
        "MBps": acked / elapsed / 1e6,
        "bytes": acked,
        "seconds": elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "overloaded": overloaded,
        "bytes_flushed": flushed.bytes_flushed if flushed else 0,
        "flushes": flushed.flushes if flushed else 0,
        "backlog_end_MiB": backlog_end / MiB if layer is not None else float("nan"),
        "backlog_max_MiB": backlog_max / MiB if layer is not None else float("nan"),
        "backlog_growth_MBps": growth / 1e6,
        "flushed_during_ingest_MBps": (acked - backlog_end) / elapsed / 1e6
        if layer is not None
        else float("nan"),
        "drain_policy_s": drain_policy,
        "drain_all_s": drain_all,
        "journal_files_in_use": journal_files,
    }


# -- 2. ack -> in S3 -------------------------------------------------------------------


async def run_ack_to_s3(
    config: Config,
    server: Tier2Server,
    storage: S3Storage,
    append_size: int,
    rate: float,
    segments: int,
    seconds: float,
) -> dict[str, float]:
    """Appends at ``rate``/s over ``segments``; latency from each ack to storage covering it."""
    layer = server.layer(storage, config)
    names = [f"bench/latency-{k}" for k in range(segments)]
    data = random.Random(3).randbytes(append_size)
    perf = time.perf_counter
    waiting: dict[str, deque[tuple[int, float]]] = {n: deque() for n in names}
    latencies: list[float] = []
    async with open_node(config, layer) as node:
        c = node.container
        for n in names:
            await (await c.admit(partial(c.prepare_create, n), 1024)).wait()

        def collect() -> None:
            now = perf()
            for n, q in waiting.items():
                stored = c.info(n).storage_length
                while q and q[0][0] <= stored:
                    latencies.append(now - q.popleft()[1])

        async def poll() -> None:
            while True:
                collect()
                await trio.sleep(LATENCY_POLL)

        async def appender(k: int, start: float, count: int) -> None:
            name = names[k]
            period = segments / rate
            for i in range(count):
                # Staggered across segments, on a fixed schedule (open loop).
                await trio.sleep_until(start + (i + k / segments) * period)
                op = await c.admit(partial(c.prepare_append, name, data), append_size + 1024)
                r = await op.wait()
                waiting[name].append((r.offset + append_size, perf()))

        count = max(1, int(seconds * rate / segments))
        async with trio.open_nursery() as outer:
            outer.start_soon(poll)
            async with trio.open_nursery() as nursery:
                start = trio.current_time() + 0.1
                for k in range(segments):
                    nursery.start_soon(appender, k, start, count)
            with trio.fail_after(config.tier2.flush_interval * 3 + 60):
                while any(waiting.values()):  # noqa: ASYNC110 - emptied by poll()
                    await trio.sleep(LATENCY_POLL)
            outer.cancel_scope.cancel()
        writer = node.storage_writer
        flushes = writer.statistics().flushes if writer is not None else 0
    latencies.sort()
    return {
        "samples": len(latencies),
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "max_ms": latencies[-1] * 1e3,
        "flushes": flushes,
    }


# -- 3. cold sequential reads ------------------------------------------------------------


async def build_cold_segment(
    config: Config, server: Tier2Server, storage: S3Storage, content: bytes
) -> None:
    """The segment from 1 MiB appends, all of it flushed to chunks."""
    layer = server.layer(storage, config)
    async with open_node(config, layer) as node:
        c = node.container
        await (await c.admit(partial(c.prepare_create, READ_SEGMENT), 1024)).wait()
        view = memoryview(content)
        for i in range(0, len(content), MiB):
            piece = view[i : i + MiB]
            await (await c.admit(partial(c.prepare_append, READ_SEGMENT, piece), MiB + 1024)).wait()
        await c.flush(READ_SEGMENT)
        info = c.info(READ_SEGMENT)
        assert info.storage_length == info.length == len(content), info


async def read_cold(
    config: Config, server: Tier2Server, storage: S3Storage, read_size: int, expected: int
) -> dict[str, float]:
    """Delete the cache, reopen, read the segment sequentially: MB/s (byte-exactness checked)."""
    shutil.rmtree(config.cache_dir, ignore_errors=True)
    layer = server.layer(storage, config)
    async with open_node(config, layer) as node:
        c = node.container
        info = c.info(READ_SEGMENT)
        size = info.length
        assert info.storage_length == size
        read = c.read
        crc = 0
        offset = 0
        started = time.perf_counter()
        while offset < size:
            r = await read(READ_SEGMENT, offset, read_size)
            crc = crc32c.crc32c(r.data, crc)
            offset += len(r.data)
        elapsed = time.perf_counter() - started
        reader = node.reader
        assert reader is not None
        stats = reader.statistics()
    if crc != expected or offset != size:
        raise AssertionError(f"cold read is not byte-exact: crc {crc:08x} != {expected:08x}")
    if stats["bytes_fetched"] < size:
        raise AssertionError(f"the read was not cold: {stats}")
    return {"MBps": size / elapsed / 1e6, "blocks_fetched": stats["blocks_fetched"]}


def raw_single(storage: S3Storage, size: int, expected: int) -> dict[str, float]:
    """One GET of the whole object, ``Body.read()``."""
    started = time.perf_counter()
    body = storage.client.get_object(Bucket=storage.bucket, Key=RAW_KEY)["Body"].read()
    elapsed = time.perf_counter() - started
    if len(body) != size or crc32c.crc32c(body) != expected:
        raise AssertionError("raw GET is not byte-exact")
    return {"MBps": size / elapsed / 1e6}


def raw_parallel(
    storage: S3Storage,
    pool: concurrent.futures.ThreadPoolExecutor,
    size: int,
    expected: int,
    range_size: int = RAW_RANGE,
) -> dict[str, float]:
    """Ranged GETs of ``range_size`` bytes, `RAW_THREADS` at a time."""
    client, bucket = storage.client, storage.bucket

    def get(start: int) -> bytes:
        end = min(size, start + range_size) - 1
        r = client.get_object(Bucket=bucket, Key=RAW_KEY, Range=f"bytes={start}-{end}")
        data: bytes = r["Body"].read()
        return data

    started = time.perf_counter()
    parts = list(pool.map(get, range(0, size, range_size)))
    elapsed = time.perf_counter() - started
    crc = 0
    for p in parts:
        crc = crc32c.crc32c(p, crc)
    if sum(map(len, parts)) != size or crc != expected:
        raise AssertionError("raw ranged GETs are not byte-exact")
    return {"MBps": size / elapsed / 1e6}


# -- driving the parts ------------------------------------------------------------------


def part_ingest(
    server: Tier2Server, root: pathlib.Path, repeat: int, scale: float
) -> list[dict[str, Any]]:
    rows = []
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for rep in range(repeat):
        for append_size, total in INGEST_CASES:
            size = max(64 * MiB, int(total * scale))
            # Alternate which mode goes first, so neither always follows the other.
            modes = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
            for mode in modes:
                with work_directory(root, f"ingest-{mode}-") as work:
                    config = make_config(work)
                    if mode == "on":
                        with server.bucket() as storage:
                            r = trio.run(run_ingest, config, server, storage, append_size, size)
                    else:
                        r = trio.run(run_ingest, config, server, None, append_size, size)
                runs.setdefault((append_size, mode), []).append(r)
                log(
                    f"rep {rep} ingest {append_size >> 10} KiB tier2 {mode}: "
                    f"{r['MBps']:.0f} MB/s, backlog max {r['backlog_max_MiB']:.0f} MiB, "
                    f"drain {r['drain_policy_s']:.2f}/{r['drain_all_s']:.2f} s"
                )
    for append_size, _ in INGEST_CASES:
        on, off = runs[(append_size, "on")], runs[(append_size, "off")]
        ratios = [a["MBps"] / b["MBps"] for a, b in zip(on, off, strict=True)]
        rows.append(
            {
                "append_size": append_size,
                "bytes_per_run": on[0]["bytes"],
                "appenders": INGEST_APPENDERS,
                "segments": INGEST_SEGMENTS,
                "off": {k: statistics.median(r[k] for r in off) for k in off[0]},
                "on": {k: statistics.median(r[k] for r in on) for k in on[0]},
                "on_worst": {
                    "backlog_max_MiB": max(r["backlog_max_MiB"] for r in on),
                    "drain_policy_s": max(r["drain_policy_s"] for r in on),
                    "drain_all_s": max(r["drain_all_s"] for r in on),
                    "overloaded": max(r["overloaded"] for r in on),
                },
                "ratio_median": statistics.median(r["MBps"] for r in on)
                / statistics.median(r["MBps"] for r in off),
                "ratio_per_round": ratios,
            }
        )
    return rows


def part_latency(server: Tier2Server, root: pathlib.Path, seconds: float) -> list[dict[str, Any]]:
    rows = []
    for label, append_size, rate, segments, interval in LATENCY_CASES:
        with work_directory(root, "latency-") as work:
            config = make_config(work, flush_interval=interval)
            with server.bucket() as storage:
                r = trio.run(
                    run_ack_to_s3, config, server, storage, append_size, rate, segments, seconds
                )
        log(f"ack -> S3, {label}: {r}")
        rows.append(
            {
                "case": label,
                "append_size": append_size,
                "rate": rate,
                "segments": segments,
                "flush_interval_s": interval,
                "flush_size": config.tier2.flush_size,
                "seconds": seconds,
                **r,
            }
        )
    return rows


def part_read(server: Tier2Server, root: pathlib.Path, size: int, repeat: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {}
    with work_directory(root, "read-") as work, server.bucket(connections=64) as storage:
        rng = random.Random(7)
        content = b"".join(rng.randbytes(min(64 * MiB, size - i)) for i in range(0, size, 64 * MiB))
        expected = crc32c.crc32c(content)
        crc_started = time.perf_counter()
        crc32c.crc32c(content)
        crc_seconds = time.perf_counter() - crc_started
        log(f"building the {size >> 20} MiB segment")
        trio.run(build_cold_segment, make_config(work), server, storage, content)
        storage.write(RAW_KEY, content, {})
        del content
        with concurrent.futures.ThreadPoolExecutor(RAW_THREADS) as pool:
            for rep in range(repeat):
                r = raw_single(storage, size, expected)
                runs.setdefault("raw_single", []).append(r)
                r2 = raw_parallel(storage, pool, size, expected)
                runs.setdefault("raw_parallel", []).append(r2)
                # Not a baseline: the gateway's request size (one block), for comparison.
                r3 = raw_parallel(storage, pool, size, expected, BLOCK_SIZE)
                runs.setdefault("raw_parallel_block", []).append(r3)
                log(
                    f"rep {rep} raw single {r['MBps']:.0f} MB/s, "
                    f"{RAW_THREADS}x{RAW_RANGE >> 20} MiB ranges {r2['MBps']:.0f} MB/s, "
                    f"{RAW_THREADS}x{BLOCK_SIZE >> 20} MiB ranges {r3['MBps']:.0f} MB/s"
                )
                for read_size, ahead, conc in READ_VARIANTS:
                    config = make_config(work, read_ahead=ahead, max_concurrency=conc)
                    r = trio.run(read_cold, config, server, storage, read_size, expected)
                    runs.setdefault(f"{read_size}/{ahead}/{conc}", []).append(r)
                    log(
                        f"rep {rep} cold read {read_size >> 10} KiB, read_ahead "
                        f"{ahead}, max_concurrency {conc}: {r['MBps']:.0f} MB/s"
                    )
    med = {k: statistics.median(r["MBps"] for r in v) for k, v in runs.items()}
    best_raw = max(med["raw_single"], med["raw_parallel"])
    variants = [
        {
            "read_size": read_size,
            "read_ahead": ahead,
            "max_concurrency": conc,
            "MBps": med[f"{read_size}/{ahead}/{conc}"],
            "runs": [r["MBps"] for r in runs[f"{read_size}/{ahead}/{conc}"]],
            "vs_best_raw": med[f"{read_size}/{ahead}/{conc}"] / best_raw,
        }
        for read_size, ahead, conc in READ_VARIANTS
    ]
    return {
        "size": size,
        "repeat": repeat,
        "raw_single_MBps": med["raw_single"],
        "raw_parallel_MBps": med["raw_parallel"],
        "raw_parallel_block_MBps": med["raw_parallel_block"],
        "block_size": BLOCK_SIZE,
        "raw_runs": {
            k: [r["MBps"] for r in runs[k]]
            for k in ("raw_single", "raw_parallel", "raw_parallel_block")
        },
        "best_raw_MBps": best_raw,
        "crc32c_seconds_per_GiB": crc_seconds * GiB / size,
        "variants": variants,
    }


# -- the report ---------------------------------------------------------------------------


def _size_label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= MiB else f"{size >> 10} KiB"


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, container in process over the embedded "
        f"SeaweedFS (same disk), median of {result['repeat']} rounds; software "
        f"{result['version']}.",
    ]
    if result.get("ingest"):
        first = result["ingest"][0]
        lines += [
            "",
            f"Sustained ingest, {first['appenders']} closed-loop appenders → "
            f"{first['segments']} segments, Tier 2 defaults (flush_size 8 MiB, max_chunk_size "
            "64 MiB, flush_interval 10 s), journal defaults (256 MiB files, 64 MiB max "
            "pending, checkpoint every 256 MiB), cache budget "
            f"{CACHE_BUDGET >> 30} GiB (pinned share {PINNED_SHARE}); Tier 2 on and off "
            "alternated each round:",
            "",
            "| append | per run | Tier 2 off MB/s | Tier 2 on MB/s | × off "
            "| flushed during ingest MB/s | backlog trend, 2nd half MB/s "
            "| backlog at end / max MiB | drain: policy / all s | p99 ack ms off / on |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in result["ingest"]:
            on, off, worst = row["on"], row["off"], row["on_worst"]
            lines.append(
                f"| {_size_label(row['append_size'])} | {row['bytes_per_run'] / GiB:.2f} GiB "
                f"| {off['MBps']:.0f} | {on['MBps']:.0f} | {row['ratio_median']:.2f}× "
                f"| {on['flushed_during_ingest_MBps']:.0f} | {on['backlog_growth_MBps']:+.0f} "
                f"| {on['backlog_end_MiB']:.0f} / {on['backlog_max_MiB']:.0f} "
                f"(worst {worst['backlog_max_MiB']:.0f}) "
                f"| {on['drain_policy_s']:.2f} / {on['drain_all_s']:.2f} "
                f"| {off['p99_ms']:.0f} / {on['p99_ms']:.0f} |"
            )
    if result.get("ack_to_s3"):
        lines += [
            "",
            "Append acknowledged → its bytes in S3 (storage_length covers them; polled every "
            f"{LATENCY_POLL * 1e3:.0f} ms):",
            "",
            "| case | rate | segments | samples | p50 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in result["ack_to_s3"]:
            lines.append(
                f"| {row['case']} | {row['rate']:.0f}/s | {row['segments']} | {row['samples']} "
                f"| {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | {row['max_ms']:.0f} |"
            )
    rd = result.get("cold_read")
    if rd:
        lines += [
            "",
            f"Cold sequential read of a {rd['size'] >> 20} MiB segment in 64 MiB chunks "
            "(cache deleted before every run), `container.read` in process, against the same "
            f"bytes as one object: one GET {rd['raw_single_MBps']:.0f} MB/s, "
            f"{RAW_THREADS} threads × {RAW_RANGE >> 20} MiB ranged GETs "
            f"{rd['raw_parallel_MBps']:.0f} MB/s (for comparison, not a baseline: "
            f"{RAW_THREADS} threads × {rd['block_size'] >> 20} MiB ranged GETs, the size of "
            f"the gateway's block GETs, {rd['raw_parallel_block_MBps']:.0f} MB/s):",
            "",
            "| read size | read_ahead | max_concurrency | MB/s | runs min–max | × best raw |",
            "|---|---|---|---|---|---|",
        ]
        for v in rd["variants"]:
            lines.append(
                f"| {_size_label(v['read_size'])} | {v['read_ahead']} | {v['max_concurrency']} "
                f"| {v['MBps']:.0f} | {min(v['runs']):.0f}–{max(v['runs']):.0f} "
                f"| {v['vs_best_raw']:.2f}× |"
            )
    t = result["targets"]
    verdicts = []
    if "ingest" in t:
        verdicts.append(
            f"ingest with flushing ≥ {TARGET_INGEST_RATIO}× without — worst case "
            f"{t['ingest']['worst_ratio']:.2f}× ({met(t['ingest']['met'])}); flushing keeps "
            f"up (backlog trend ≤ {KEEPS_UP_GROWTH:.0%} of the ingest rate) — "
            f"{'yes' if t['ingest']['flushing_keeps_up'] else 'NO'}"
        )
    if "cold_read" in t:
        verdicts.append(
            f"cold sequential read ≥ {TARGET_READ_RATIO}× the best raw GET — default "
            f"read_ahead {t['cold_read']['default_ratio']:.2f}×, best "
            f"{t['cold_read']['best_ratio']:.2f}× ({met(t['cold_read']['met'])})"
        )
    lines += ["", "Targets: " + "; ".join(verdicts) + ".", TABLE_END]
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where journals, caches and the S3 server's data go (default: .bench-tmp)",
        repeat_help="rounds (default 3)",
        quick_help="smoke test: 1 round, small sizes",
    )
    parser.add_argument("--read-size", type=int, default=1 * GiB, help="cold-read segment bytes")
    parser.add_argument(
        "--latency-seconds", type=float, default=20.0, help="per ack-to-S3 case (default 20)"
    )
    parser.add_argument(
        "--parts", default="ingest,latency,read", help="comma-separated subset to run"
    )
    args = parser.parse_args()
    scale = 1.0
    if args.quick:
        args.repeat, args.read_size, args.latency_seconds, scale = 1, 256 * MiB, 4.0, 0.125
    parts = set(args.parts.split(","))
    stop_on_signals()
    result: dict[str, Any] = {
        **result_header("tier2"),
        "repeat": args.repeat,
        "quick": args.quick,
    }
    with work_directory(args.dir, "tier2-") as root:
        server = Tier2Server(root / "s3")
        try:
            log("starting SeaweedFS")
            server.start()
            if "ingest" in parts:
                result["ingest"] = part_ingest(server, root, args.repeat, scale)
            if "latency" in parts:
                result["ack_to_s3"] = part_latency(server, root, args.latency_seconds)
            if "read" in parts:
                size = args.read_size // MiB * MiB
                result["cold_read"] = part_read(server, root, size, args.repeat)
        finally:
            server.stop()
    targets: dict[str, Any] = {}
    if "ingest" in result:
        worst = min(row["ratio_median"] for row in result["ingest"])
        # Flushing keeps up when the backlog stops growing: its trend over the
        # second half of the run is small against the ingest rate.
        keeps_up = all(
            row["on"]["backlog_growth_MBps"] <= KEEPS_UP_GROWTH * row["on"]["MBps"]
            for row in result["ingest"]
        )
        targets["ingest"] = {
            "worst_ratio": worst,
            "met": worst >= TARGET_INGEST_RATIO,
            "flushing_keeps_up": keeps_up,
        }
    if "cold_read" in result:
        variants = result["cold_read"]["variants"]
        default = next(
            v
            for v in variants
            if (v["read_size"], v["read_ahead"], v["max_concurrency"]) == DEFAULT_READ_VARIANT
        )
        best = max(v["vs_best_raw"] for v in variants)
        targets["cold_read"] = {
            "default_ratio": default["vs_best_raw"],
            "best_ratio": best,
            "met": default["vs_best_raw"] >= TARGET_READ_RATIO,
        }
    result["targets"] = targets
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
