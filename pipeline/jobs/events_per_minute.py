"""Events per key per minute, from JSON events in ``lines`` segments, to Parquet.

Each event is a JSON object with a ``key`` (string) and ``ts`` (Unix
seconds, or an ISO-8601 string). The job reads every segment under
``<mount>/<stream>`` through the mount, counts events per key and minute,
and writes ``<out>`` as Parquet (overwritten), one row per (key, minute)
with the columns ``key``, ``minute`` (timestamp, UTC) and ``events``.

Run it with ``segment-gateway pipeline run events_per_minute --mount ./mnt
--out DIR [--stream demo/clicks]`` or ``spark-submit
pipeline/jobs/events_per_minute.py --mount ./mnt --out DIR``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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
