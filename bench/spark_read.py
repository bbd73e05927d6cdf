#!/usr/bin/env python3
"""Spark over the mount against Spark over local files, same bytes, same run.

A real daemon (embedded SeaweedFS as Tier 2, mount in the work directory)
gets ~2 GiB of JSON-lines events in four segments (~3.5 MB appends), sealed
and flushed to Tier 2; the same bytes are also written to four local files.
Then, for each query, a local Spark session (``local[2]``, one for the whole
run) times:

- **mount, cold**: the daemon restarted with its cache deleted and the page
  cache dropped, so every byte comes from S3 through the mount;
- **mount, warm**: the same query again (page cache and the daemon's memory);
- **local, cold**: the local copy after dropping the page cache;
- **local, warm**: again.

Queries: ``spark.read.json(dir).count()`` and the ``segments`` source
(``codec=lines``) ``.count()``; the local baseline for the latter is
``spark.read.text(dir).count()`` over the copy (the source needs the
mount's xattrs and event index). Each is checked to count every event.
Medians of --repeat runs; targets (speed through the mount ÷ local files): JSON
warm at least 0.9, cold at least 0.6; the ``segments`` source warm at least 0.6
(of Spark's native text reader), cold at least 0.5. Prints one JSON document;
--write-table rewrites the section of docs/PERFORMANCE.md. --quick: 256 MiB, one run.
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import (
    argument_parser,
    drop_page_cache,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    running_daemon,
)
from gateway.client.sync import SyncClient

MiB = 1024 * 1024
GiB = 1024 * MiB
SEGMENTS = 4
TABLE_START = "<!-- bench/spark_read.py:start -->"
TABLE_END = "<!-- bench/spark_read.py:end -->"
#: Speed through the mount ÷ speed over local files, per (query, cache).
TARGETS = {
    ("json", "cold"): 0.6,
    ("json", "warm"): 0.9,
    ("segments", "cold"): 0.5,
    ("segments", "warm"): 0.6,
}
CONFIG = '[tier2]\nurl = "embedded"\n[logging]\nlevel = "warning"\n'


def event_block(segment: int) -> tuple[bytes, int]:
    """20,000 JSON lines (~3.5 MB) and their count: the unit of data and of appends."""
    pad = "x" * 120
    lines = [
        b'{"key":"k%d","ts":%d,"seg":%d,"n":%d,"pad":"%s"}\n'
        % (n % 97, 1_700_000_000 + n // 10, segment, n, pad.encode())
        for n in range(20_000)
    ]
    return b"".join(lines), len(lines)


def build(address: str, local: pathlib.Path, total: int) -> int:
    """Write the segments and their local copies; returns the event count."""
    events = 0
    local.mkdir(parents=True, exist_ok=True)
    with SyncClient(address) as c:
        for s in range(SEGMENTS):
            name = f"bench/events/{s}"
            block, n = event_block(s)
            reps = max(1, total // SEGMENTS // len(block))
            events += n * reps
            c.create(name)
            with open(local / str(s), "wb") as f:
                for _ in range(reps):
                    # One block per append: appends end on line boundaries,
                    # which is what the event index of a lines segment needs.
                    c.append(name, block)
                    f.write(block)
            c.seal(name)
        log("flushing to Tier 2")
        c.flush()
    return events


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def main() -> int:
    parser = argument_parser(__doc__, quick_help="256 MiB, one run")
    parser.add_argument("--size", type=int, default=2 * GiB, help="bytes of events")
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeat = 256 * MiB, 1
    args.dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=args.dir, prefix="spark-"))
    data_dir, mnt, local = work / "data", work / "mnt", work / "local"
    try:
        from pipeline.session import local_session

        with running_daemon(work, CONFIG, data_dir, mnt) as address:
            log(f"writing {args.size / GiB:.2f} GiB of events")
            events = build(address, local, args.size)
        spark = local_session("bench spark_read")
        results: dict[str, list[float]] = {}
        partitions: dict[str, int] = {}

        def queries(root: pathlib.Path, on_mount: bool) -> dict[str, Any]:
            path = f"file://{root}"
            if on_mount:
                source = spark.read.format("segments").option("codec", "lines").load(str(root))
            else:
                source = spark.read.text(path)
            return {"json": spark.read.json(path), "segments": source}

        for r in range(args.repeat):
            log(f"round {r + 1}/{args.repeat}")
            # Through the mount: cold (cache wiped, daemon restarted), then warm.
            shutil.rmtree(data_dir / "cache", ignore_errors=True)
            with running_daemon(work, CONFIG, data_dir, mnt):
                for name, df in queries(mnt / "bench/events", True).items():
                    drop_page_cache(log)
                    took, count = timed(df.count)
                    assert count == events, (name, count, events)
                    results.setdefault(f"mount_cold_{name}", []).append(took)
                    took, count = timed(df.count)
                    assert count == events, (name, count, events)
                    results.setdefault(f"mount_warm_{name}", []).append(took)
                    partitions[f"mount_{name}"] = df.rdd.getNumPartitions()
            for name, df in queries(local, False).items():
                drop_page_cache(log)
                took, count = timed(df.count)
                assert count == events, (name, count, events)
                results.setdefault(f"local_cold_{name}", []).append(took)
                took, count = timed(df.count)
                results.setdefault(f"local_warm_{name}", []).append(took)
                partitions[f"local_{name}"] = df.rdd.getNumPartitions()
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    medians = {k: statistics.median(v) for k, v in results.items()}
    rows = []
    for name in ("json", "segments"):
        for temp in ("cold", "warm"):
            mount, base = medians[f"mount_{temp}_{name}"], medians[f"local_{temp}_{name}"]
            target = TARGETS[name, temp]
            rows.append(
                {
                    "query": name,
                    "cache": temp,
                    "mount_s": mount,
                    "local_s": base,
                    "ratio": base / mount,  # speed relative to local files
                    "MBps": args.size / mount / 1e6,
                    "target": target,
                    "met": base / mount >= target,
                }
            )
    result = {
        **result_header("spark_read"),
        "bytes": args.size,
        "events": events,
        "repeat": args.repeat,
        "partitions": partitions,
        "runs": results,
        "rows": rows,
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}: "
        f"{result['bytes'] / GiB:.2f} GiB of JSON lines ({result['events']:,} events) in "
        f"{SEGMENTS} sealed segments, flushed to the embedded SeaweedFS; the same bytes in "
        f"{SEGMENTS} local files on the same disk. Spark `local[2]`, median of "
        f"{result['repeat']} runs. Cold: the daemon restarted with its cache deleted (every "
        "byte from S3) and the page cache dropped; local cold: page cache dropped. Warm: the "
        "same query again. `segments` is the gateway's data source (codec=lines), compared "
        "with `spark.read.text` on the local copy. Partitions (default 128 MiB split): "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["partitions"].items()))
        + ".",
        "",
        "| query | cache | mount s | local s | mount ÷ local speed | mount MB/s | target | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['query']}.count() | {r['cache']} | {r['mount_s']:.1f} | {r['local_s']:.1f} "
            f"| {r['ratio']:.2f}× | {r['MBps']:.0f} | ≥ {r['target']}× "
            f"| {met(r['met'])} |"
        )
    lines.append(TABLE_END)
    replace_table(path, TABLE_START, TABLE_END, lines)


if __name__ == "__main__":
    raise SystemExit(main())
