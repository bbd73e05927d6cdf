"""A streaming query over a stream while the gateway (not the driver) is SIGKILLed.

A real daemon with its mount; two exactly-once writers append to a rolling
stream and record every acknowledged event; a separate Spark driver
(tests/helpers/stream_driver.py, ``local[2]``) runs a query over the stream
with a trigger of two seconds into Spark's Parquet file sink with a
checkpoint. The gateway is killed with SIGKILL several times at random
points, some anywhere, some just after the query logged a batch's offsets
(while its tasks read), seeded (``SEGMENT_GATEWAY_TEST_SEED`` replays a
run), and started again each time: its mount answers ENOTCONN while it is
down, and its mountpoint is a plain empty directory for a moment while it
comes back. The
query may fail (a task that cannot read) and is then started again from its
checkpoint; it may never take the segments it cannot see for deleted. At
the end Spark's read of the sink (its ``_spark_metadata`` log honoured)
holds every acknowledged event exactly once.
"""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")

from gateway.client.sync import SyncClient
from tests.helpers.mount import mounted_daemon
from tests.helpers.wait import wait_for

# Serial (tests/conftest.py): deadlines on a query under SIGKILLs, missed with
# another worker beside it.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILLS = 3


def line(k: int, i: int) -> bytes:
    return b'{"w": %d, "n": %d}' % (k, i)


def test_gateway_sigkills_under_a_running_query_keep_every_event_exactly_once(
    tmp_path: Any,
) -> None:
    import pyarrow.parquet as pq

    seed = int(os.environ.get("SEGMENT_GATEWAY_TEST_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    print(f"seed {seed}")
    config = (
        f'[tier2]\nurl = "file://{tmp_path}/tier2"\nflush_size = "16 KiB"\n'
        'flush_interval = "300ms"\n[streams]\ninterval = "100ms"\n'
    )
    with mounted_daemon(tmp_path, config) as d:
        with SyncClient(d.address) as c:
            c.create_stream("restarts/clicks", {"roll_size": 16384})
        acked: list[bytes] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def write(k: int) -> None:
            import trio

            from gateway.client.writer import open_segment_writer

            async def main() -> None:
                async with open_segment_writer(
                    d.address, "restarts/clicks", codec="lines", max_batch_bytes=1024
                ) as w:
                    i = 0
                    while not stop.is_set():
                        batch = [line(k, i + j) for j in range(20)]
                        for e in batch:
                            await w.write(e)
                        await w.flush()
                        acked.extend(batch)
                        i += 20
                        await trio.sleep(0.05)

            try:
                trio.run(main)
            except BaseException as e:
                errors.append(e)

        out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        until, dump, log = tmp_path / "until", tmp_path / "sink.parquet", tmp_path / "driver.log"
        command = [
            sys.executable, "-m", "tests.helpers.stream_driver", str(d.mnt / "restarts"),
            str(checkpoint), str(out), "--sink", "parquet", "--trigger", "2 seconds",
            "--retry-failed", "40", "--until-file", str(until), "--dump", str(dump),
            "--stall", "40",
        ]  # fmt: skip

        def batches() -> int:
            """Batches whose offsets the query has logged (each before it runs)."""
            logged = checkpoint / "offsets"
            return sum(1 for f in logged.iterdir() if f.name.isdigit()) if logged.exists() else 0

        writers = [threading.Thread(target=write, args=(k,)) for k in range(2)]
        for t in writers:
            t.start()
        with log.open("wb") as output:
            p = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            try:
                # Mid-stream: once the query has committed a batch.
                wait_for(
                    lambda: p.poll() is None and (out / "_spark_metadata" / "0").exists(),
                    90,
                    "the first batch in the sink",
                )
                for _ in range(KILLS):
                    if rnd.random() < 0.5:
                        # Random kill points are the subject of this test.
                        time.sleep(rnd.uniform(1.0, 5.0))  # anywhere
                    else:
                        # While a batch runs: its offsets are logged before its tasks.
                        n = batches()
                        # At most a minute for the next batch, then kill anyway
                        # (a kill point, not an assertion: no failure on timeout).
                        deadline = time.monotonic() + 60
                        while batches() == n and time.monotonic() < deadline:
                            time.sleep(0.005)
                        time.sleep(rnd.uniform(0.0, 0.3))
                    d.kill()
                    time.sleep(rnd.uniform(0.0, 3.0))  # the mount answers ENOTCONN
                    d.start(timeout=90)
                    assert p.poll() is None, log.read_text(errors="replace")[-3000:]
                time.sleep(rnd.uniform(1.0, 3.0))
            finally:
                stop.set()
                for t in writers:
                    t.join(timeout=120)
            assert not errors, errors
            assert len(acked) > 2000
            until.write_text(str(len(acked)))
            p.wait(timeout=180)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        text = log.read_text(errors="replace")
        assert p.returncode == 0, text[-3000:]
        print(text.splitlines()[-1])  # "done: N row(s), K failed query run(s)"
        # What the source met (for a reader of the run): waits, kept segments, task retries.
        print(
            collections.Counter(
                re.sub(r"\S*/\S*", "…", m.split(":")[1]).strip()
                for m in re.findall(r"segments: [^\n]*", text)
            )
        )
    got = [bytes(e) for e in pq.read_table(dump).column("event").to_pylist()]
    counts = collections.Counter(got)
    twice = [e for e, n in counts.items() if n > 1]
    missing = set(acked) - set(got)
    assert not twice, f"{len(twice)} event(s) more than once in the sink (seed {seed})"
    assert not missing, f"{len(missing)} acknowledged event(s) not in the sink (seed {seed})"
    assert len(got) == len(acked)
