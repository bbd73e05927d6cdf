"""A Spark driver running one streaming query over the mount, to be killed by tests.

``python -m tests.helpers.stream_driver MOUNT_PATH CHECKPOINT OUT`` reads the
segments under MOUNT_PATH with the streaming ``segments`` source (lines; ``--format
segments-jvm``: its JVM port, which goes on from the other's checkpoint too) and
writes each micro-batch's events to ``OUT/batch=<id>`` as Parquet, replacing
what an earlier attempt of the same batch left: with Spark's checkpoint
(offsets logged before a batch runs, the commit after), that is exactly
once however the driver dies. With ``--until N`` it stops once the batches
written hold N events; otherwise it runs until killed. With ``--restarts K``
it also stops the query K times at random points (``--seed``) and starts it
again from the checkpoint, in the same process.

With ``--sink parquet`` the query writes to OUT with Spark's own Parquet
file sink (its ``_spark_metadata`` log says which files hold the data);
``--retry-failed K`` starts a failed query again from its checkpoint, up to
K times; ``--until-file F``: once F exists it holds a number N, and the
driver stops when Spark's read of the sink has held at least N rows for
``--settle`` seconds (so that a late duplicate shows), or has not grown for
``--stall`` seconds, writing what that read gives to ``--dump`` (one
Parquet file).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import sys
import time
from typing import Any


def written(out: str) -> int:
    """Events in the finished batch directories (those with a _SUCCESS file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 0
    for d in os.listdir(out) if os.path.isdir(out) else []:
        path = os.path.join(out, d)
        try:
            if os.path.exists(os.path.join(path, "_SUCCESS")):
                n += pq.read_table(path).num_rows
        except (OSError, pa.ArrowException):
            pass  # a replayed batch being written over: counted next time
    return n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--trigger", default="300 milliseconds")
    p.add_argument("--until", type=int, default=0)
    p.add_argument("--max-events", type=int, default=0)
    p.add_argument("--restarts", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sink", choices=("batches", "parquet"), default="batches")
    p.add_argument("--retry-failed", type=int, default=0)
    p.add_argument("--until-file", default="")
    p.add_argument("--dump", default="")
    p.add_argument("--stall", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--format", default="segments", choices=("segments", "segments-jvm"))
    args = p.parse_args()
    rnd = random.Random(args.seed)

    from pyspark.sql import DataFrame

    from pipeline.session import local_session

    spark = local_session("stream driver")
    reader = spark.readStream.format(args.format).option("codec", "lines")
    if args.max_events:
        reader = reader.option("maxEventsPerTrigger", str(args.max_events))
    events = reader.load(args.path)

    def sink(df: DataFrame, batch_id: int) -> None:
        df.select("segment", "offset", "event").write.mode("overwrite").parquet(
            os.path.join(args.out, f"batch={batch_id:06d}")
        )

    def start() -> Any:
        if args.sink == "parquet":
            writer = (
                events.select("segment", "offset", "event")
                .writeStream.format("parquet")
                .option("path", args.out)
            )
        else:
            writer = events.writeStream.foreachBatch(sink)
        return (
            writer.option("checkpointLocation", args.checkpoint)
            .trigger(processingTime=args.trigger)
            .start()
        )

    def sink_rows() -> int:
        """Rows in the Parquet sink as Spark reads it (only files its log commits)."""
        if not os.path.isdir(os.path.join(args.out, "_spark_metadata")):
            return 0
        return int(spark.read.parquet(args.out).count())

    query = start()
    print("started", flush=True)
    restarts = args.restarts
    failures = 0
    grown = (-1, time.monotonic())  # (rows in the sink, when that was first seen)
    reached = 0.0  # when the sink first held the rows wanted
    stop_at = time.monotonic() + rnd.uniform(0.5, 3.0)
    while True:
        if query.exception() is not None:
            print(f"query failed: {query.exception()}"[:3000], file=sys.stderr, flush=True)
            if failures >= args.retry_failed:
                return 1
            failures += 1
            print(f"restarting the failed query from its checkpoint ({failures})", flush=True)
            query = start()
            continue
        if args.until_file and os.path.exists(args.until_file):
            want = int(pathlib.Path(args.until_file).read_text())
            rows = sink_rows()
            now = time.monotonic()
            if rows != grown[0]:
                grown = (rows, now)
            if rows >= want and not reached:
                reached = now
            if (reached and now - reached > args.settle) or now - grown[1] > args.stall:
                query.stop()
                if args.dump:
                    import pyarrow.parquet as pq

                    pq.write_table(spark.read.parquet(args.out).toArrow(), args.dump)
                print(f"done: {rows} row(s), {failures} failed query run(s)", flush=True)
                spark.stop()
                return 0
            time.sleep(1.0)
        if args.until and written(args.out) >= args.until:
            query.stop()
            spark.stop()
            return 0
        if restarts and time.monotonic() > stop_at:
            query.stop()  # wherever the batch is: the next start replays or goes on
            query = start()
            restarts -= 1
            stop_at = time.monotonic() + rnd.uniform(0.5, 3.0)
        time.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
