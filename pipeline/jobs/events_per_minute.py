"""Events per key per minute, from JSON events in ``lines`` segments, to Parquet.

Each event is a JSON object with a ``key`` (string) and ``ts`` (Unix
seconds, or an ISO-8601 string). The job reads every segment under
``<mount>/<stream>`` through the mount, counts events per key and minute,
and writes ``<out>`` as Parquet (overwritten), one row per (key, minute)
with the columns ``key``, ``minute`` (timestamp, UTC) and ``events``.

Run it with ``segment-gateway pipeline run events_per_minute --mount ./mnt
--out DIR [--stream demo/clicks]`` or ``spark-submit
pipeline/jobs/events_per_minute.py --mount ./mnt --out DIR``.

With ``--streaming`` it runs as a Structured Streaming query over the
streaming ``segments`` source instead (`run_streaming`): events are counted
as they are appended, per key and one-minute window, with a watermark
(``--watermark``, default 1 minute: events later than that behind the
newest are dropped), and each window is appended to ``<out>`` as Parquet
once the watermark passes its end. Progress is kept in ``--checkpoint``
(default ``<out>.checkpoint``): stop it any way, start it again, and it goes
on where it was, every event counted once. ``--available-now`` reads what
is there and stops.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from pipeline.lines import read_lines


def events_per_minute(events: DataFrame) -> DataFrame:
    """(key, minute, events) from a DataFrame with ``key`` and ``ts`` columns."""
    ts = F.col("ts")
    when = (
        F.to_timestamp(ts)
        if dict(events.dtypes).get("ts") == "string"
        else F.timestamp_seconds(ts.cast("double"))
    )
    return (
        events.where(F.col("key").isNotNull() & ts.isNotNull())
        .select(
            F.col("key").cast("string").alias("key"), F.date_trunc("minute", when).alias("minute")
        )
        .groupBy("key", "minute")
        .agg(F.count(F.lit(1)).alias("events"))
        .orderBy("key", "minute")
    )


def run(spark: SparkSession, mount: str, out: str, stream: str = "") -> int:
    """Run the job; returns the number of (key, minute) rows written."""
    path = os.path.join(os.path.abspath(mount), stream)
    events = read_lines(spark, f"file://{path}", "json", recursive=True)
    result = events_per_minute(events)
    result.write.mode("overwrite").parquet(os.path.abspath(out))
    return spark.read.parquet(os.path.abspath(out)).count()


def windowed_counts(events: DataFrame, watermark: str = "1 minute") -> DataFrame:
    """(key, minute, events) per one-minute window of a stream of ``segments`` rows."""
    fields = F.from_json(F.col("event").cast("string"), "key string, ts string")
    ts = F.col("e.ts")
    when = F.when(ts.rlike(r"^[0-9]+(\.[0-9]*)?$"), F.timestamp_seconds(ts.cast("double")))
    parsed = events.select(fields.alias("e")).select(
        F.col("e.key").alias("key"), when.otherwise(F.to_timestamp(ts)).alias("when")
    )
    return (
        parsed.where(F.col("key").isNotNull() & F.col("when").isNotNull())
        .withWatermark("when", watermark)
        .groupBy("key", F.window("when", "1 minute"))
        .agg(F.count(F.lit(1)).alias("events"))
        .select("key", F.col("window.start").alias("minute"), "events")
    )


def run_streaming(
    spark: SparkSession,
    mount: str,
    out: str,
    stream: str = "",
    checkpoint: str = "",
    trigger: float = 10.0,
    watermark: str = "1 minute",
    available_now: bool = False,
) -> StreamingQuery:
    """Start the streaming job (see the module's docstring); returns the running query."""
    path = os.path.join(os.path.abspath(mount), stream)
    out = os.path.abspath(out)
    events = spark.readStream.format("segments").option("codec", "lines").load(path)
    writer = (
        windowed_counts(events, watermark)
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", out)
        .option("checkpointLocation", checkpoint or out.rstrip("/") + ".checkpoint")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger} seconds")
    return writer.start()


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit`` entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mount", required=True, help="the gateway's mountpoint")
    p.add_argument("--out", required=True, help="output directory (Parquet)")
    p.add_argument("--stream", default="", help="directory under the mount (default: all)")
    args = p.parse_args(argv)
    spark = SparkSession.builder.appName("events_per_minute").getOrCreate()
    rows = run(spark, args.mount, args.out, args.stream)
    print(f"events_per_minute: {rows} (key, minute) row(s) in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
