#!/usr/bin/env python3
"""Spark over the mount against Spark over local files, same bytes, same run.

A real daemon (embedded SeaweedFS as Tier 2, mount in the work directory)
gets ~2 GiB of JSON-lines events in four segments (~3.5 MB appends), sealed
and flushed to Tier 2; the same bytes are also written to four local files.
Then, for each query, a local Spark session (``local[2]``, one for the whole
run) times:

- **mount, cold**: the daemon restarted with its cache deleted and the page
  cache dropped, so every byte comes from S3 through the mount;
- **mount, warm**: the same query again (page cache and the daemon's memory),
  once the daemon made the segments' files for passthrough (if it read them whole);
- **local, cold**: the local copy after dropping the page cache;
- **local, warm**: again.

Queries (each checked to count every event, or to sum every event's bytes):
``spark.read.json(dir).count()``; Spark's ``text`` reader; the Python
``segments`` source and the JVM one (``segments-jvm``, pipeline/jvm), both
``codec=lines``, ``.count()`` and ``sum(length(event))``. Baselines from the
same run: JSON over the local files for JSON; Spark's ``text`` reader over
the *same bytes through the mount* for the sources (the issue's target), and
over the local files. Medians of --repeat runs; targets: JSON warm at least
0.9 of local files, cold at least 0.6; ``segments-jvm`` at least 0.8 of
``text`` through the mount, warm and cold; the Python ``segments`` source
(for the record) at least 0.6 / 0.5 of ``text`` over local files. Prints one
JSON document; --write-table rewrites the section of docs/PERFORMANCE.md.
--quick: 256 MiB, one run.
"""

from __future__ import annotations

import contextlib
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
    wait_for_segment_files,
)
from gateway.client.sync import SyncClient

MiB = 1024 * 1024
GiB = 1024 * MiB
SEGMENTS = 4
TABLE_START = "<!-- bench/spark_read.py:start -->"
TABLE_END = "<!-- bench/spark_read.py:end -->"
#: (query, its baseline, the speed ratio wanted per cache; None: for the record).
ROWS: list[tuple[str, str, dict[str, float] | None]] = [
    ("json", "local_json", {"cold": 0.6, "warm": 0.9}),
    ("segments", "local_text", {"cold": 0.5, "warm": 0.6}),
    ("segments-jvm", "mount_text", {"cold": 0.8, "warm": 0.8}),
    ("segments-jvm", "local_text", None),
    ("segments-jvm-bytes", "mount_text-bytes", {"cold": 0.8, "warm": 0.8}),
    ("text", "local_text", None),
]
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


def build(address: str, local: pathlib.Path, total: int) -> tuple[int, int]:
    """Write the segments and their local copies; the event count and their bytes."""
    events = 0
    nbytes = 0
    local.mkdir(parents=True, exist_ok=True)
    with SyncClient(address) as c:
        for s in range(SEGMENTS):
            name = f"bench/events/{s}"
            block, n = event_block(s)
            reps = max(1, total // SEGMENTS // len(block))
            events += n * reps
            nbytes += (len(block) - n) * reps  # without the newlines
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
    return events, nbytes


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
            events, nbytes = build(address, local, args.size)
        spark = local_session("bench spark_read")
        results: dict[str, list[float]] = {}
        partitions: dict[str, int] = {}

        def queries(root: pathlib.Path, on_mount: bool) -> dict[str, tuple[Any, Any]]:
            """name -> (DataFrame, what it must give); sums are of the events' bytes."""
            path = f"file://{root}"
            text = spark.read.text(path)
            out = {
                "json": (spark.read.json(path), events),
                "text": (text, events),
                "text-bytes": (text.selectExpr("sum(octet_length(value)) AS total_bytes"), nbytes),
            }
            if on_mount:
                for fmt in ("segments", "segments-jvm"):
                    df = spark.read.format(fmt).option("codec", "lines").load(str(root))
                    out[fmt] = (df, events)
                jvm = out["segments-jvm"][0]
                out["segments-jvm-bytes"] = (
                    jvm.selectExpr("sum(length(event)) AS total_bytes"),
                    nbytes,
                )
            return out

        def run(df: Any, want: int) -> float:
            took, got = timed(
                df.count if "total_bytes" not in df.columns else lambda: df.first().total_bytes
            )
            assert got == want, (got, want)
            return took

        for r in range(args.repeat):
            log(f"round {r + 1}/{args.repeat}")
            # Through the mount: cold (cache wiped, daemon restarted), then warm.
            shutil.rmtree(data_dir / "cache", ignore_errors=True)
            shutil.rmtree(data_dir / "segment-files", ignore_errors=True)
            for where, root in (("mount", mnt / "bench/events"), ("local", local)):
                with contextlib.ExitStack() as stack:
                    if where == "mount":
                        stack.enter_context(running_daemon(work, CONFIG, data_dir, mnt))
                    for name, (df, want) in queries(root, where == "mount").items():
                        if where == "mount":
                            # Every query cold from S3: the daemon's cache wiped too,
                            # and the segment files passthrough serves from.
                            stack.close()
                            shutil.rmtree(data_dir / "cache", ignore_errors=True)
                            shutil.rmtree(data_dir / "segment-files", ignore_errors=True)
                            stack.enter_context(running_daemon(work, CONFIG, data_dir, mnt))
                        drop_page_cache(log)
                        results.setdefault(f"{where}_cold_{name}", []).append(run(df, want))
                        if where == "mount":
                            # The files of the segments the cold query read in
                            # full, so the warm one is what a user's next query
                            # gets (a query that read only some bytes leaves none).
                            made = wait_for_segment_files(data_dir, SEGMENTS, 60.0)
                            if made < SEGMENTS:
                                log(f"segment files: {made} of {SEGMENTS}; the warm query goes on")
                        results.setdefault(f"{where}_warm_{name}", []).append(run(df, want))
                        if not name.endswith("-bytes"):  # an aggregate's is its last stage's
                            partitions[f"{where}_{name}"] = df.rdd.getNumPartitions()
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    medians = {k: statistics.median(v) for k, v in results.items()}
    rows = []
    for name, baseline, targets in ROWS:
        for temp in ("cold", "warm"):
            mount = medians[f"mount_{temp}_{name}"]
            where, base_name = baseline.split("_", 1)
            base = medians[f"{where}_{temp}_{base_name}"]
            target = targets[temp] if targets is not None else None
            rows.append(
                {
                    "query": name,
                    "baseline": f"{base_name} ({where})",
                    "cache": temp,
                    "mount_s": mount,
                    "baseline_s": base,
                    "ratio": base / mount,  # speed relative to the baseline
                    "MBps": args.size / mount / 1e6,
                    "target": target,
                    "met": target is None or base / mount >= target,
                }
            )
    result = {
        **result_header("spark_read"),
        "bytes": args.size,
        "events": events,
        "event_bytes": nbytes,
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
        "byte from S3) and the page cache dropped, for every query; local cold: page "
        "cache dropped. Warm: the same query again, once the daemon has made the segments' "
        "files (FUSE passthrough serves it from them). `segments` is the Python data source, "
        "`segments-jvm` the JVM one (pipeline/jvm), both codec=lines; `-bytes` queries sum "
        "the events' lengths instead of counting them. Partitions (default 128 MiB split): "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["partitions"].items()))
        + ".",
        "",
        "| query | cache | through the mount s | baseline | baseline s | speed ÷ baseline "
        "| MB/s | target | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        target = f"≥ {r['target']}×" if r["target"] is not None else "(for the record)"
        lines.append(
            f"| {r['query']} | {r['cache']} | {r['mount_s']:.1f} | {r['baseline']} "
            f"| {r['baseline_s']:.1f} | {r['ratio']:.2f}× | {r['MBps']:.0f} | {target} "
            f"| {met(r['met']) if r['target'] is not None else ''} |"
        )
    lines.append(TABLE_END)
    replace_table(path, TABLE_START, TABLE_END, lines)


if __name__ == "__main__":
    raise SystemExit(main())
