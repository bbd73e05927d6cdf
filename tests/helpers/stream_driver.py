"""A Spark driver running one streaming query over the mount, to be killed by tests.

``python -m tests.helpers.stream_driver MOUNT_PATH CHECKPOINT OUT`` reads the
segments under MOUNT_PATH with the streaming ``segments`` source (lines) and
writes each micro-batch's events to ``OUT/batch=<id>`` as Parquet, replacing
what an earlier attempt of the same batch left: with Spark's checkpoint
(offsets logged before a batch runs, the commit after), that is exactly
once however the driver dies. With ``--until N`` it stops once the batches
written hold N events; otherwise it runs until killed. With ``--restarts K``
it also stops the query K times at random points (``--seed``) and starts it
again from the checkpoint, in the same process.
"""

from __future__ import annotations

import argparse
import os
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
    args = p.parse_args()
    rnd = random.Random(args.seed)

    from pyspark.sql import DataFrame

    from pipeline.session import local_session

    spark = local_session("stream driver")
    reader = spark.readStream.format("segments").option("codec", "lines")
    if args.max_events:
        reader = reader.option("maxEventsPerTrigger", str(args.max_events))
    events = reader.load(args.path)

    def sink(df: DataFrame, batch_id: int) -> None:
        df.select("segment", "offset", "event").write.mode("overwrite").parquet(
            os.path.join(args.out, f"batch={batch_id:06d}")
        )

    def start() -> Any:
        return (
            events.writeStream.foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime=args.trigger)
            .start()
        )

    query = start()
    print("started", flush=True)
    restarts = args.restarts
    stop_at = time.monotonic() + rnd.uniform(0.5, 3.0)
    while True:
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
            return 1
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
