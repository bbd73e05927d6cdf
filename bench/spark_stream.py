#!/usr/bin/env python3
"""Spark Structured Streaming over the mount: latency and sustained rate, same run.

A real daemon (Tier 2 on the local filesystem, the mount in the work
directory) and one local Spark session (``local[2]``):

- **Latency**: an exactly-once writer appends JSON lines to a ``lines``
  segment at a steady rate (2,000 events/s in batches of 20, each batch
  flushed: its events are acknowledged when the flush returns). A
  streaming query over the streaming ``segments`` source with a 1 s
  processing-time trigger writes with ``foreachBatch``, which notes when
  each event is in the sink. Latency = sink time - acknowledgement time;
  p50 and p99 over every event. Target: p99 at most twice the trigger.
- **Sustained rate**: the same kind of events pre-appended to two sealed
  ``lines`` segments; the batch ``segments`` source counts them
  (``spark.read.format("segments").load(...).count()``) and a streaming
  query reads them all with ``trigger(availableNow=True)`` in micro-batches
  of ``maxBytesPerTrigger`` (256 MiB), counting in ``foreachBatch``. Both
  read warm (page cache). Events/s (streaming: over the micro-batches' own
  time after the first, which also starts the query's Python workers),
  streaming ÷ batch; target ≥ 0.8.
- **Sustained rate, JVM**: the same segments through ``segments-jvm``: the
  batch source (``spark.read.format("segments-jvm")``) and the streaming one
  (``readStream``, ``availableNow``, the same ``maxBytesPerTrigger``), both
  written to Spark's ``noop`` sink, so both read every row and column and
  drop them in the JVM (a batch ``count()`` would not write the event bytes:
  Spark prunes columns in a batch scan, never in a streaming one; and a
  Python ``foreachBatch`` would add a round trip per batch that the batch
  side does not pay). Events/s as above; streaming ÷ batch, target ≥ 0.9.

Medians of --repeat runs. Prints one JSON document; --write-table rewrites
the section of docs/PERFORMANCE.md. --quick: smaller and one run.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import (
    argument_parser,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    running_daemon,
)
from gateway.client.sync import SyncClient

MiB = 1024 * 1024
TABLE_START = "<!-- bench/spark_stream.py:start -->"
TABLE_END = "<!-- bench/spark_stream.py:end -->"
TRIGGER = 1.0
RATE = 2000
TARGET_P99 = 2 * TRIGGER
TARGET_RATE = 0.8
TARGET_JVM_RATE = 0.9
CONFIG = '[tier2]\nurl = "file://{tier2}"\n[logging]\nlevel = "warning"\n'


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def latency_run(
    spark: Any, address: str, mnt: pathlib.Path, name: str, seconds: float
) -> dict[str, float]:
    """One latency run: (p50, p99) in seconds, and the events measured."""
    import trio
    from pyspark.sql import functions as F

    from gateway.client.writer import open_segment_writer

    with SyncClient(address) as c:
        c.create(name, codec="lines")
    acked: dict[int, float] = {}
    in_sink: dict[int, float] = {}
    total = int(seconds * RATE)

    def sink(df: Any, batch_id: int) -> None:
        ns = df.select(
            F.get_json_object(F.col("event").cast("string"), "$.n").cast("long")
        ).collect()
        now = time.time()
        for (n,) in ns:
            in_sink[n] = now

    query = (
        spark.readStream.format("segments")
        .load(str(mnt / name))
        .writeStream.foreachBatch(sink)
        .trigger(processingTime=f"{TRIGGER} seconds")
        .start()
    )

    async def write() -> None:
        async with open_segment_writer(address, name, codec="lines") as w:
            start = time.monotonic()
            for i in range(0, total, 20):
                for n in range(i, i + 20):
                    await w.write(b'{"n": %d, "pad": "%s"}' % (n, b"x" * 80))
                await w.flush()
                now = time.time()
                for n in range(i, i + 20):
                    acked[n] = now
                # Hold the rate: 20 events per 10 ms.
                await trio.sleep_until(
                    trio.current_time() + max(0.0, start + (i + 20) / RATE - time.monotonic())
                )

    time.sleep(3)  # the query's first (empty) batches
    writer = threading.Thread(target=lambda: trio.run(write))
    writer.start()
    writer.join()
    deadline = time.monotonic() + 60
    while len(in_sink) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    if len(in_sink) != total:
        raise RuntimeError(f"{len(in_sink)} of {total} events reached the sink")
    latencies = [in_sink[n] - acked[n] for n in acked]
    return {"p50": statistics.median(latencies), "p99": percentile(latencies, 99), "events": total}


def bulk(address: str, size: int) -> int:
    """Two sealed lines segments of JSON events, ``size`` bytes in all; the event count."""
    line = b'{"n": %d, "key": "k%d", "pad": "' + b"y" * 100 + b'"}\n'
    block = b"".join(line % (n, n % 97) for n in range(30_000))
    events = 0
    with SyncClient(address) as c:
        for s in range(2):
            name = f"bench/bulk/{s}"
            c.create(name, codec="lines")
            for _ in range(max(1, size // 2 // len(block))):
                c.append(name, block)
                events += 30_000
            c.seal(name)
    return events


def rate_run(
    spark: Any, mnt: pathlib.Path, events: int, checkpoint: pathlib.Path, trigger_bytes: int
) -> dict[str, float]:
    """Seconds to read every bulk event: batch source, then streaming (availableNow)."""
    path = str(mnt / "bench/bulk")
    started = time.perf_counter()
    count = spark.read.format("segments").load(path).count()
    batch = time.perf_counter() - started
    if count != events:
        raise RuntimeError(f"batch source counted {count} of {events}")
    counted: list[int] = []
    shutil.rmtree(checkpoint, ignore_errors=True)
    started = time.perf_counter()
    query = (
        spark.readStream.format("segments")
        .option("maxBytesPerTrigger", str(trigger_bytes))
        .load(path)
        .writeStream.foreachBatch(lambda df, _: counted.append(df.count()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    wall = time.perf_counter() - started
    if sum(counted) != events:
        raise RuntimeError(f"streaming source counted {sum(counted)} of {events}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return sustained(progress, batch, count / batch, wall)


def sustained(
    progress: list[dict[str, Any]], batch: float, batch_rate: float, wall: float
) -> dict[str, float]:
    """A run's figures from its micro-batches' progress (those that read rows).

    Sustained: the micro-batches' own time (planning, reading, the sink, the
    checkpoint), after the first: that one also starts a Python source's
    workers (0.5-0.7 s here), which a running query does once (the JVM
    source has none to start, but the same cut keeps the two parts alike).
    """
    first, rest = progress[0], progress[1:]
    if not rest:
        raise RuntimeError("one micro-batch only: give --size several times --trigger-bytes")
    busy = sum(p["durationMs"]["triggerExecution"] for p in rest) / 1000
    events = sum(p["numInputRows"] for p in rest)
    if os.environ.get("BENCH_DEBUG"):
        log(json.dumps([p["durationMs"] for p in progress]))
    return {
        "batch_s": batch,
        "batch_events_per_s": batch_rate,
        "stream_events_per_s": events / busy,
        "first_batch_s": first["durationMs"]["triggerExecution"] / 1000,
        "wall_s": wall,
        "batches": len(progress),
    }


def jvm_rate_run(
    spark: Any, mnt: pathlib.Path, events: int, checkpoint: pathlib.Path, trigger_bytes: int
) -> dict[str, float]:
    """Seconds to read every bulk event through segments-jvm: batch, then streaming."""
    path = str(mnt / "bench/bulk")
    started = time.perf_counter()
    spark.read.format("segments-jvm").load(path).write.format("noop").mode("overwrite").save()
    batch = time.perf_counter() - started
    shutil.rmtree(checkpoint, ignore_errors=True)
    started = time.perf_counter()
    query = (
        spark.readStream.format("segments-jvm")
        .option("maxBytesPerTrigger", str(trigger_bytes))
        .load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    wall = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    if sum(p["numInputRows"] for p in progress) != events:
        raise RuntimeError(f"segments-jvm streaming read {sum(p['numInputRows'] for p in progress)}"
                           f" of {events}")  # fmt: skip
    return sustained(progress, batch, events / batch, wall)


def main() -> int:
    parser = argument_parser(__doc__, quick_help="8 s, 64 MiB, one run")
    parser.add_argument("--seconds", type=float, default=20.0, help="of steady appends")
    parser.add_argument("--size", type=int, default=1024 * MiB, help="bytes for the rate run")
    parser.add_argument("--trigger-bytes", type=int, default=256 * MiB,
                        help="maxBytesPerTrigger of the rate run")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.size, args.repeat, args.trigger_bytes = 8.0, 64 * MiB, 1, 16 * MiB
    args.dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=args.dir, prefix="stream-"))
    latency: list[dict[str, float]] = []
    rates: list[dict[str, float]] = []
    jvm_rates: list[dict[str, float]] = []
    try:
        from pipeline.session import local_session

        config = CONFIG.format(tier2=work / "tier2")
        with running_daemon(work, config, work / "data", work / "mnt") as address:
            mnt = work / "mnt"
            spark = local_session("bench spark_stream")
            try:
                log(f"writing {args.size / MiB:.0f} MiB of events")
                events = bulk(address, args.size)
                # Warms the page cache (and checks the count).
                rate_run(spark, mnt, events, work / "ckpt", args.trigger_bytes)
                jvm_count = spark.read.format("segments-jvm").load(str(mnt / "bench/bulk")).count()
                if jvm_count != events:
                    raise RuntimeError(f"segments-jvm counted {jvm_count} of {events}")
                jvm_rate_run(spark, mnt, events, work / "ckpt", args.trigger_bytes)
                for r in range(args.repeat):
                    log(f"round {r + 1}/{args.repeat}")
                    latency.append(
                        latency_run(spark, address, mnt, f"bench/live/{r}", args.seconds)
                    )
                    rates.append(rate_run(spark, mnt, events, work / "ckpt", args.trigger_bytes))
                    jvm_rates.append(
                        jvm_rate_run(spark, mnt, events, work / "ckpt", args.trigger_bytes)
                    )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p50 = statistics.median(r["p50"] for r in latency)
    p99 = statistics.median(r["p99"] for r in latency)
    batch_rate = statistics.median(r["batch_events_per_s"] for r in rates)
    stream_rate = statistics.median(r["stream_events_per_s"] for r in rates)
    jvm_batch = statistics.median(r["batch_events_per_s"] for r in jvm_rates)
    jvm_stream = statistics.median(r["stream_events_per_s"] for r in jvm_rates)
    # The ratio of each round (batch and streaming measured one after the
    # other), then their median: a busy moment hits one round, not the ratio.
    jvm_ratio = statistics.median(
        r["stream_events_per_s"] / r["batch_events_per_s"] for r in jvm_rates
    )
    result = {
        **result_header("spark_stream"),
        "trigger_s": TRIGGER,
        "rate_events_per_s": RATE,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "latency": latency,
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "p99_met": p99 <= TARGET_P99,
        "bytes": args.size,
        "trigger_bytes": args.trigger_bytes,
        "events": events,
        "rates": rates,
        "batch_events_per_s": batch_rate,
        "stream_events_per_s": stream_rate,
        "ratio": stream_rate / batch_rate,
        "ratio_met": stream_rate / batch_rate >= TARGET_RATE,
        "first_batch_s": statistics.median(r["first_batch_s"] for r in rates),
        "jvm": {
            "rates": jvm_rates,
            "batch_events_per_s": jvm_batch,
            "stream_events_per_s": jvm_stream,
            "ratio": jvm_ratio,
            "ratio_met": jvm_ratio >= TARGET_JVM_RATE,
            "first_batch_s": statistics.median(r["first_batch_s"] for r in jvm_rates),
        },
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    jvm = result["jvm"]
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}, Spark "
        f"`local[2]`, medians of {result['repeat']} runs. Latency: {result['rate_events_per_s']:,} "
        f"events/s for {result['seconds']:.0f} s into a `lines` segment, trigger "
        f"{result['trigger_s']:.0f} s, `foreachBatch` sink. Rate: {result['bytes'] / MiB:.0f} MiB "
        f"({result['events']:,} events) in two sealed segments, warm; streaming with "
        "`availableNow` and `maxBytesPerTrigger` "
        f"{result['trigger_bytes'] / MiB:.0f} MiB; its events/s over the "
        "micro-batches' own time (Spark's `triggerExecution`) after the first, which "
        f"also starts the query's Python workers ({result['first_batch_s']:.1f} s here). "
        "`segments-jvm`: the same bytes, batch and streaming both into Spark's `noop` sink "
        "(every row and column read); ratio: the median of the rounds' ratios.",
        "",
        "| measure | baseline | streaming source | | target | |",
        "|---|---|---|---|---|---|",
        f"| append ack → row in sink, p50 | trigger {result['trigger_s'] * 1000:.0f} ms "
        f"| {result['p50_ms']:.0f} ms | | | |",
        f"| append ack → row in sink, p99 | trigger {result['trigger_s'] * 1000:.0f} ms "
        f"| {result['p99_ms']:.0f} ms "
        f"| {result['p99_ms'] / 1000 / result['trigger_s']:.2f}× trigger "
        f"| ≤ 2× | {met(result['p99_met'])} |",
        f"| events/s | batch source {result['batch_events_per_s']:,.0f} "
        f"| {result['stream_events_per_s']:,.0f} | {result['ratio']:.2f}× "
        f"| ≥ {TARGET_RATE}× | {met(result['ratio_met'])} |",
        f"| events/s, `segments-jvm` | batch `segments-jvm` {jvm['batch_events_per_s']:,.0f} "
        f"| {jvm['stream_events_per_s']:,.0f} | {jvm['ratio']:.2f}× "
        f"| ≥ {TARGET_JVM_RATE}× | {met(jvm['ratio_met'])} |",
        TABLE_END,
    ]
    replace_table(path, TABLE_START, TABLE_END, lines)


if __name__ == "__main__":
    raise SystemExit(main())
