#!/usr/bin/env python3
"""Scale benchmark: the baseline of issue 33 (months at scale), before its changes.

One SeaweedFS (`gateway.embedded.EmbeddedS3`) and real gateway daemons on
buckets of their own, each with its mount in the work directory. Two parts:

- **Trickle**: one node (``tier2.flush_interval = "1s"``), N segments
  (--trickle-segments, default 1,000) each getting one small event (a
  63-byte line) a second for --trickle-seconds (default 180), so each
  segment is flushed many times; run twice, each on a bucket of its own,
  with ``tier2.defrag`` off and on (the merge rules at their defaults,
  ``defrag_interval`` 10 s, ``gc_grace`` 5 s). Measured: the node's Tier-2
  requests by operation over the run (its /metrics,
  ``segment_gateway_tier2_requests``; a concat also counted as the S3
  GETs and PUT it makes) extrapolated to an hour, and, once the last
  flushes, merges and deletions are done, the chunk objects under the
  node's ``chunks/`` prefix per segment (listed with boto3). The defrag-off
  run's segments are then sealed and read cold -- a Spark
  ``read.text(<mount>/fleet).count()`` (``local[2]``, median of
  --spark-repeat) and every segment through the mount (Python reads, one
  file after another), each with the node started on an empty cache
  directory and the page cache dropped --; the node is started again with
  defrag on and packs them (the optimizer looks at every segment after a
  start), and they are read cold again: before and after, the same bytes.
- **Scale**: for 10^3, 10^4 and 10^5 segments (10^6 with --million), a
  fresh node gets that many segments as fast as one client allows (create,
  one 100-byte append, seal, pipelined over 64 tasks; 1% left active),
  then waits until everything is in Tier 2. A tenth of the names sit at the
  mount's root, the rest in ``big/``. Measured: daemon RSS (``/proc``);
  one checkpoint (checkpoints are due every ``journal.checkpoint_every_frames``
  = 300 frames and are not timed by the daemon: 400 appends one at a time
  on an active segment, each its own frame, so at least one checkpoint
  falls among them; its cost on the event loop shows as the longest append
  stall over the median; its bytes from ``journal-dump`` after the stop);
  the newest metadata snapshot's bytes in Tier 2 (``tier2.snapshot_interval
  = "5s"``); time to stop and to start again until ready; after the start,
  ``ls`` (``ls -1``, i.e. sorted, as a user runs it) of the mount's root and
  of ``big/``, cold then again, and ``stat`` of one segment; then a second
  daemon on the same bucket (a follower, default ``cluster.refresh_interval``
  0.5 s): how long it takes to show all the first node's segments, and, in
  steady state over --follow-seconds (default 30), the first node's CPU
  (``/proc/PID/stat``) against the same window before the follower
  started, and the traffic on the first node's protocol port (``ss -ti``
  of its accepted connections: bytes each way and data segments in, about
  one per request for small requests). The daemon counts no server-side
  requests (no such metric exists), so the segments are the measure; the
  listing pages a refresh takes (``client.list``: pages of 10,000) per
  ``refresh_interval`` are given beside them as the expected rate.

Every step's time is logged; a step that fails is recorded (as a finding)
and the rest of that size is skipped. Prints one JSON document (progress on
stderr); --write-table rewrites the trickle's and the scale part's tables
in docs/PERFORMANCE.md (--skip-trickle, --skip-scale: only the other's).
--quick: 100 trickle segments for 60 s, one Spark count each, sizes 10^3 and
10^4, 10 s windows.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    argument_parser,
    drop_page_cache,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    stop_on_signals,
    work_directory,
)
from replication import free_port  # noqa: E402

from gateway.client.client import ResponseFuture, open_client  # noqa: E402

TABLE_START = "<!-- bench/scale.py:start -->"
TABLE_END = "<!-- bench/scale.py:end -->"
READY_TIMEOUT = 600.0
STOP_TIMEOUT = 300.0
SETTLE_TIMEOUT = 1800.0
EVENT = b'{"sensor":"s0000","t":0000000000,"v":0.0000000000000000000000}\n'  # 63 bytes
TASKS = 64
CONNECTIONS = 4
LIST_PAGE = 10_000  # gateway/server/handlers/segments.py MAX_LIST
REFRESH_INTERVAL = 0.5  # cluster.refresh_interval's default
CHECKPOINT_APPENDS = 400
CLK_TCK = os.sysconf("SC_CLK_TCK")
TRICKLE_START = "<!-- bench/scale.py trickle:start -->"
TRICKLE_END = "<!-- bench/scale.py trickle:end -->"
TRICKLE_TIER2 = 'flush_interval = "1s"\n'
#: The optimizer's look every 10 s (default 60 s: a bench of minutes would see a few
#: looks), replaced objects deleted after 5 s (default 1 h); the merge rules at their
#: defaults (runs of 16 chunks below max_chunk_size / 4).
DEFRAG_INTERVAL = 10
DEFRAG_TIER2 = f'defrag = true\ndefrag_interval = "{DEFRAG_INTERVAL}s"\ngc_grace = "5s"\n'
MAX_CHUNK_SIZE = 64 * 1024 * 1024  # tier2.max_chunk_size's default


# -- a daemon -----------------------------------------------------------------------


class Daemon:
    """One daemon on fixed loopback ports, with its mount (or none) and metrics."""

    def __init__(self, root: pathlib.Path, name: str, config: str, env: dict[str, str],
                 mount: bool = True) -> None:  # fmt: skip
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.config_text = config
        self.env = env
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_port = free_port()
        self.ready = self.dir / "ready"
        self.log_path = self.dir / "daemon.log"
        self.mountpoint = self.dir / "mnt" if mount else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.cache_runs = 0

    def start(self, fresh_cache: bool = False) -> float:
        """Start it and wait until ready; the seconds that took."""
        if fresh_cache:
            self.cache_runs += 1
        cache_dir = self.dir / f"cache{self.cache_runs}"
        config = self.dir / "gateway.toml"
        config.write_text(self.config_text.replace("@CACHE@", str(cache_dir)))
        if self.mountpoint is not None:
            self.mountpoint.mkdir(exist_ok=True)
        self.ready.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "gateway.cli", "--config", str(config),
            "serve", "--data-dir", str(self.dir / "data"), "--listen", self.address,
            "--ready-file", str(self.ready),
            "--mountpoint", str(self.mountpoint or ""),
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
        ]  # fmt: skip
        started = time.monotonic()
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
        deadline = started + READY_TIMEOUT
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready in {READY_TIMEOUT:.0f}s")
            time.sleep(0.02)
        return time.monotonic() - started

    def stop(self) -> float:
        """SIGTERM, SIGKILL if it takes too long; the seconds it took to exit."""
        started = time.monotonic()
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in {STOP_TIMEOUT:.0f}s; killing it")
            self.kill()
        took = time.monotonic() - started
        self.unmount()
        return took

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.unmount()

    def unmount(self) -> None:
        if self.mountpoint is not None and os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], check=False,
                           capture_output=True)  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """Its /metrics samples by name and labels as printed."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=60) as r:
            text = r.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def tier2_requests(self) -> dict[str, float]:
        prefix = 'segment_gateway_tier2_requests_total{operation="'
        alt = 'segment_gateway_tier2_requests{operation="'
        out = {}
        for k, v in self.metrics().items():
            for p in (prefix, alt):
                if k.startswith(p):
                    out[k[len(p) : -2]] = v
        return out

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        """CPU seconds it used so far (user + system, ``/proc/PID/stat``)."""
        assert self.proc is not None
        stat = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def node_config(node: str, bucket: str, endpoint: str, tier2: str) -> str:
    return f"""
[node]
id = "{node}"
[cache]
dir = "@CACHE@"
budget = "1 GiB"
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
retry_deadline = "30s"
{tier2}
[journal]
preallocate_step = "8 MiB"
"""


@contextlib.contextmanager
def bucket_of_its_own(s3: Any, tag: str) -> Iterator[tuple[str, Any]]:
    """A fresh bucket; yields its name and a boto3 client."""
    import boto3

    from gateway.storage.s3 import S3Storage

    bucket = f"bench-{tag}-{uuid.uuid4().hex[:8]}"
    storage = S3Storage(bucket, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                        secret_key=s3.secret_key)  # fmt: skip
    storage.create_bucket_if_missing()
    storage.close()
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, aws_access_key_id=s3.access_key,
                          aws_secret_access_key=s3.secret_key,
                          region_name="us-east-1")  # fmt: skip
    yield bucket, client


def objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += page.get("Contents", [])
    return out


def timed(what: str, steps: dict[str, float]) -> Callable[[Callable[[], Any]], Any]:
    """Run the function now, log and keep its seconds in ``steps`` under ``what``."""

    def run(fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        log(f"{what} ...")
        value = fn()
        steps[what] = round(time.monotonic() - started, 2)
        log(f"{what}: {steps[what]:.1f} s")
        return value

    return run


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = SETTLE_TIMEOUT) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not {what} within {timeout:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - started


def flushed(node: Daemon) -> bool:
    return node.metrics().get("segment_gateway_pending_flush_bytes", 1) == 0


# -- loading ------------------------------------------------------------------------


async def create_all(address: str, names: list[str], append: bytes | None,
                     seal: Callable[[int], bool], budget: float = 1e9,
                     timings: dict[str, float] | None = None) -> int:  # fmt: skip
    """Create ``names``, then append ``append`` to each, then seal where ``seal(i)``.

    In three passes, each pipelined (TASKS requests in flight over
    CONNECTIONS connections): on one connection, a request that is not a
    create waits until the creates before it have their names claimed, so
    mixing them would take a claim's round trip per segment. Gives up after
    ``budget`` seconds: returns how many passes were done (3 when all).
    """
    done = 0

    async def each(what: str, one: Callable[[Any, int, str], Any], count: int) -> None:
        todo = iter(enumerate(names[:count]))
        finished = 0
        started = time.monotonic()

        async def worker(client: Any) -> None:
            nonlocal finished
            for i, name in todo:
                await one(client, i, name)
                finished += 1
                if finished % 10_000 == 0:
                    log(f"  {what}: {finished:,}")

        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(open_client(address))
                       for _ in range(CONNECTIONS)]  # fmt: skip
            async with trio.open_nursery() as nursery:
                for k in range(TASKS):
                    nursery.start_soon(worker, clients[k % CONNECTIONS])
        if timings is not None:
            timings[what] = round(time.monotonic() - started, 2)

    async def create(client: Any, i: int, name: str) -> None:
        await client.create(name)

    async def add(client: Any, i: int, name: str) -> None:
        assert append is not None
        await client.append(name, append)

    async def close(client: Any, i: int, name: str) -> None:
        if seal(i):
            await client.seal(name)

    made = len(names)
    with trio.move_on_after(budget) as scope:
        await each("created", create, made)
        done = 1
        if append is not None:
            await each("appended", add, made)
        done = 2
        await each("sealed", close, made)
        done = 3
    if scope.cancelled_caught:
        log(f"  gave up after {budget:.0f} s in pass {done + 1} of 3")
    return done


async def trickle(address: str, names: list[str], seconds: float) -> dict[str, Any]:
    """One event a second to every segment for ``seconds``; appends made and rounds late."""
    rounds = late = 0
    async with open_client(address) as client:
        started = trio.current_time()
        while trio.current_time() - started < seconds:
            due = started + rounds + 1
            futures: list[ResponseFuture] = []
            for name in names:
                futures.append(await client.start_append(name, EVENT))
            for f in futures:
                await f.wait()
            rounds += 1
            now = trio.current_time()
            if now > due:
                late += 1
            else:
                await trio.sleep(due - now)
    return {"rounds": rounds, "appends": rounds * len(names), "rounds_late": late}


async def one_at_a_time(address: str, name: str, count: int) -> list[float]:
    """``count`` appends to ``name``, each waited for: their latencies in seconds."""
    out = []
    async with open_client(address) as client:
        for _ in range(count):
            t = time.monotonic()
            await client.append(name, EVENT)
            out.append(time.monotonic() - t)
    return out


def checkpoint_frames(journal: pathlib.Path) -> list[int]:
    """Payload bytes of every checkpoint frame in a stopped node's journal (journal-dump)."""
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "journal-dump", "--json", str(journal)],
        capture_output=True, text=True, cwd=ROOT, timeout=900, check=False,
    ).stdout  # fmt: skip
    sizes = []
    for line in out.splitlines():
        row = json.loads(line)
        if any("checkpoint" in k for k in row.get("kinds", {})):
            sizes.append(row["payload_bytes"])
    return sizes


# -- part 1: the trickle -------------------------------------------------------------


def chunk_objects(s3c: Any, bucket: str, node_id: str, segments: int) -> dict[str, Any]:
    """The chunk objects under the node's ``chunks/`` prefix (boto3), per segment."""
    objs = objects(s3c, bucket, f"gw/{node_id}/chunks/")
    per: dict[str, int] = {}
    for o in objs:
        seg = o["Key"].split("/")[3]
        per[seg] = per.get(seg, 0) + 1
    counts = sorted(per.values())
    return {
        "objects": len(objs),
        "mean": len(objs) / segments,
        "min": counts[0] if counts else 0,
        "median": statistics.median(counts) if counts else 0,
        "max": counts[-1] if counts else 0,
        "bytes_mean": sum(o["Size"] for o in objs) / max(1, len(objs)),
    }


async def pipelined(address: str, names: list[str], one: Callable[[Any, str], Any]) -> None:
    """``await one(client, name)`` for each name, TASKS in flight over CONNECTIONS."""
    todo = iter(names)

    async def worker(client: Any) -> None:
        for name in todo:
            await one(client, name)

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(address))
                   for _ in range(CONNECTIONS)]  # fmt: skip
        async with trio.open_nursery() as nursery:
            for k in range(TASKS):
                nursery.start_soon(worker, clients[k % CONNECTIONS])


async def named_chunks(address: str, prefix: str) -> int:
    """Chunks the node's metadata names for the segments under ``prefix``."""
    async with open_client(address) as client:
        return sum(s.chunk_count for s in await client.list(prefix, local_only=True))


def defrag_counters(node: Daemon) -> dict[str, float]:
    m = node.metrics()
    p = "segment_gateway_defrag_"
    return {k: m.get(p + k + "_total", 0.0) for k in
            ("runs", "chunks_replaced", "objects_deleted", "failures")}  # fmt: skip


def optimizer_settled(node: Daemon, quiet: float) -> float:
    """Wait until the optimizer merged nothing for ``quiet`` s and its replaced objects
    went to deletion; the seconds waited."""
    started = time.monotonic()
    last = defrag_counters(node)
    since = time.monotonic()
    while True:
        time.sleep(1.0)
        now = defrag_counters(node)
        if now["runs"] != last["runs"] or now["objects_deleted"] < now["chunks_replaced"]:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return time.monotonic() - started
        if time.monotonic() - started > SETTLE_TIMEOUT:
            raise RuntimeError(f"the optimizer still busy after {SETTLE_TIMEOUT:.0f}s: {now}")


def objects_settled(node: Daemon, s3c: Any, bucket: str) -> float:
    """Wait until the bucket holds only the chunk objects the node names (the replaced ones
    deleted); the seconds waited."""
    named = trio.run(named_chunks, node.address, "fleet/")
    return wait_for(lambda: len(objects(s3c, bucket, f"gw/{node.name}/chunks/")) <= named,
                    "the replaced objects deleted", timeout=600)  # fmt: skip


def cold_mount_read(node: Daemon, names: list[str]) -> dict[str, Any]:
    """Every segment read through the mount (Python reads, one file after another), the node
    started on an empty cache directory and the page cache dropped."""
    node.stop()
    node.start(fresh_cache=True)
    drop_page_cache(warn=log)
    before = node.tier2_requests()
    assert node.mountpoint is not None
    mnt = node.mountpoint
    t = time.monotonic()
    total = 0
    for name in names:
        with open(mnt / name, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    took = time.monotonic() - t
    after = node.tier2_requests()
    return {
        "seconds": took, "bytes": total, "MBps": total / took / 1e6,
        "files_per_s": len(names) / took,
        "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after},
    }  # fmt: skip


def cold_spark_count(node: Daemon, spark: Any, lines: int) -> dict[str, Any]:
    """``spark.read.text(<mount>/fleet).count()``, the node started on an empty cache
    directory and the page cache dropped; checked to count every line."""
    node.stop()
    node.start(fresh_cache=True)
    drop_page_cache(warn=log)
    assert node.mountpoint is not None
    before = node.tier2_requests()
    t = time.monotonic()
    count = spark.read.text(f"file://{node.mountpoint}/fleet").count()
    took = time.monotonic() - t
    after = node.tier2_requests()
    if count != lines:
        raise RuntimeError(f"Spark counted {count} lines through the mount, appended {lines}")
    return {"seconds": took, "lines": count,
            "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after}}  # fmt: skip


def cold_reads(node: Daemon, names: list[str], spark: Any, lines: int, repeat: int,
               steps: dict[str, float], what: str) -> dict[str, Any]:  # fmt: skip
    """The cold Spark count (median of ``repeat``) and one cold read through the mount."""
    out: dict[str, Any] = {}
    if spark is not None:
        runs = [
            timed(f"trickle: {what}: cold Spark count {r + 1}", steps)(
                lambda: cold_spark_count(node, spark, lines)
            )
            for r in range(repeat)
        ]
        out["spark"] = {"runs_s": [r["seconds"] for r in runs],
                        "median_s": statistics.median(r["seconds"] for r in runs),
                        "tier2_requests": runs[-1]["tier2_requests"]}  # fmt: skip
    out["mount"] = timed(f"trickle: {what}: cold read through the mount", steps)(
        lambda: cold_mount_read(node, names)
    )
    return out


def run_trickle(work: pathlib.Path, s3: Any, env: dict[str, str], segments: int,
                seconds: float, spark_repeat: int) -> dict[str, Any]:  # fmt: skip
    """The trickle twice, on buckets of their own: with ``tier2.defrag`` off, then on."""
    out: dict[str, Any] = {"segments": segments, "seconds": seconds, "tier2": TRICKLE_TIER2,
                           "defrag_tier2": DEFRAG_TIER2}  # fmt: skip
    spark = None
    try:
        from pipeline.session import local_session

        if spark_repeat > 0:
            spark = local_session("bench scale trickle")
    except Exception as e:  # measured without Spark, and said so
        out.setdefault("failures", []).append(f"Spark: {type(e).__name__}: {e}")
        log(f"trickle: no Spark: {e}")
    try:
        for defrag in (False, True):
            key = "on" if defrag else "off"
            out[key] = trickle_once(work, s3, env, segments, seconds, defrag, spark, spark_repeat)
            if out[key].get("failures"):
                out.setdefault("failures", []).extend(f"defrag {key}: {f}"
                                                      for f in out[key]["failures"])  # fmt: skip
    finally:
        if spark is not None:
            spark.stop()
    return out


def trickle_once(work: pathlib.Path, s3: Any, env: dict[str, str], segments: int,
                 seconds: float, defrag: bool, spark: Any,
                 spark_repeat: int) -> dict[str, Any]:  # fmt: skip
    """One trickle: N segments, an event a second each for ``seconds``.

    With ``defrag`` off, the segments are then sealed and read cold (Spark and
    the mount), the node started again with defrag on to pack them, and read
    cold again: the same segments before and after defragmentation.
    """
    key = "on" if defrag else "off"
    out: dict[str, Any] = {"defrag": defrag, "steps": {}}
    steps = out["steps"]
    names = [f"fleet/sensor{i:05d}" for i in range(segments)]
    with bucket_of_its_own(s3, f"trickle-{key}") as (bucket, s3c):

        def config(on: bool) -> str:
            tier2 = TRICKLE_TIER2 + (DEFRAG_TIER2 if on else "defrag = false\n")
            return node_config("node-t", bucket, s3.endpoint_url, tier2)

        node = Daemon(work / f"trickle-{key}", "node-t", config(defrag), env)
        try:
            steps["start_s"] = round(node.start(), 2)
            timed(f"trickle {key}: create", steps)(
                lambda: trio.run(create_all, node.address, names, None, lambda i: False)
            )
            before = node.tier2_requests()
            merges_before = defrag_counters(node)
            t0 = time.monotonic()
            out["load"] = timed(f"trickle {key}: appends", steps)(
                lambda: trio.run(trickle, node.address, names, seconds)
            )
            elapsed = time.monotonic() - t0
            after = node.tier2_requests()
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            out["tier2_requests"] = delta
            out["tier2_requests_per_hour"] = {k: v * 3600 / elapsed for k, v in delta.items()}
            merges = defrag_counters(node)
            out["defrag_counters"] = {k: merges[k] - merges_before[k] for k in merges}
            # A concat is one request of the layer, but the GETs of its sources and a PUT in S3.
            s3_requests = sum(delta.values()) - delta.get("concat", 0)
            s3_requests += (
                out["defrag_counters"]["chunks_replaced"] + out["defrag_counters"]["runs"]
            )
            out["s3_requests_per_hour"] = s3_requests * 3600 / elapsed
            out["elapsed_s"] = elapsed
            out["bytes_per_segment"] = out["load"]["rounds"] * len(EVENT)
            out["rss_mib"] = node.rss_mib()
            timed(f"trickle {key}: the last flushes", steps)(
                lambda: wait_for(lambda: flushed(node), "flushed")
            )
            if defrag:
                timed(f"trickle {key}: the optimizer's last look", steps)(
                    lambda: optimizer_settled(node, 2 * DEFRAG_INTERVAL + 2)
                )
                timed(f"trickle {key}: replaced objects deleted", steps)(
                    lambda: objects_settled(node, s3c, bucket)
                )
            # Still active: the tail of each segment is its newest object.
            out["chunk_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
            log(f"trickle {key}: {out['chunk_objects_per_segment']}")
            if defrag:
                return out
            lines = out["load"]["rounds"] * segments
            timed("trickle off: seal", steps)(
                lambda: trio.run(pipelined, node.address, names, lambda c, n: c.seal(n))
            )
            wait_for(lambda: flushed(node), "flushed")
            out["sealed_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
            out["before"] = cold_reads(node, names, spark, lines, spark_repeat, steps, "before")
            # Defragmentation switched on: after a start the optimizer looks at every
            # segment once, and packs each sealed one into chunks of max_chunk_size.
            node.stop()
            node.config_text = config(True)
            node.start()
            before = node.tier2_requests()
            t = time.monotonic()
            timed("trickle off: packed by the optimizer", steps)(
                lambda: optimizer_settled(node, 2 * DEFRAG_INTERVAL + 2)
            )
            timed("trickle off: replaced objects deleted", steps)(
                lambda: objects_settled(node, s3c, bucket)
            )
            after = node.tier2_requests()
            out["packing"] = {
                "seconds": time.monotonic() - t,
                "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after},
                **defrag_counters(node),
            }
            out["packed_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
            log(f"trickle off: packed {out['packed_objects_per_segment']}")
            out["after"] = cold_reads(node, names, spark, lines, spark_repeat, steps, "after")
            for when in ("before", "after"):
                total = out[when]["mount"]["bytes"]
                expected = out["bytes_per_segment"] * segments
                if total != expected:
                    out.setdefault("failures", []).append(
                        f"{when}: read {total} bytes through the mount, appended {expected}"
                    )
        except Exception as e:
            out.setdefault("failures", []).append(f"{type(e).__name__}: {e}")
            out["traceback"] = traceback.format_exception(e)[-8:]
            out["daemon_tail"] = node.tail().splitlines()
            log(f"trickle {key} FAILED: {e}")
        finally:
            node.stop()
    return out


# -- part 2: scale --------------------------------------------------------------------


def scale_names(n: int) -> list[str]:
    at_root = max(1, n // 10)
    return [f"r{i:07d}" for i in range(at_root)] + [f"big/s{i:07d}" for i in range(n - at_root)]


def timed_ls(path: pathlib.Path) -> tuple[float, int]:
    t = time.monotonic()
    r = subprocess.run(["ls", "-1", str(path)], capture_output=True, check=True, timeout=900)
    return time.monotonic() - t, r.stdout.count(b"\n")


def timed_stat(path: pathlib.Path) -> float:
    t = time.monotonic()
    os.stat(path)
    return time.monotonic() - t


def served_traffic(port: int) -> dict[str, int]:
    """Bytes and TCP segments over the connections accepted on ``port`` (``ss -ti``)."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    got = {"bytes_sent": 0, "bytes_received": 0, "data_segs_in": 0, "connections": 0}
    for line in out.splitlines():
        if f":{port} " in line:
            got["connections"] += 1
        for key in ("bytes_sent", "bytes_received", "data_segs_in"):
            m = re.search(rf"\b{key}:(\d+)", line)
            if m:
                got[key] += int(m.group(1))
    return got


def window(node: Daemon, seconds: float) -> dict[str, float]:
    """``node``'s CPU share, and what its protocol port sent and got per second."""
    port = int(node.address.rpartition(":")[2])
    c0 = node.cpu_seconds()
    t0 = served_traffic(port)
    time.sleep(seconds)
    c1 = node.cpu_seconds()
    t1 = served_traffic(port)
    per_s = {f"{k}_per_s": (t1[k] - t0[k]) / seconds for k in t0 if k != "connections"}
    return {"cpu_share": (c1 - c0) / seconds, "connections": t1["connections"], **per_s}


def bulk_install(node: Daemon, n: int, steps: dict[str, float]) -> list[str]:
    """Install ``n`` sealed, flushed segments on the stopped, empty ``node``
    (`tests.helpers.bulk`): a tenth (at most 10^5) members of the stream
    ``big``, 1% left active at the end; their names."""
    from tests.helpers import bulk

    members = min(n // 10, 100_000)
    config = node.dir / "gateway.toml"
    config.write_text(node.config_text.replace("@CACHE@", str(node.dir / "cache0")))
    t = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "tests.helpers.bulk", "--config", str(config),
         "--data-dir", str(node.dir / "data"), "--segments", str(n), "--stream", "big",
         "--members", str(members), "--active", str(max(1, n // 100))],
        cwd=ROOT, env={**os.environ, **node.env}, check=True, timeout=SETTLE_TIMEOUT,
        stdout=sys.stderr,
    )  # fmt: skip
    steps["bulk_install_s"] = round(time.monotonic() - t, 2)
    log(f"{n}: installed in {steps['bulk_install_s']:.1f} s")
    return bulk.names(n, "big", members)


def make_segments(node: Daemon, names: list[str], active: int, budget: float,
                  out: dict[str, Any]) -> None:  # fmt: skip
    """Create, append to and seal ``names`` through the protocol (all but ``active``)."""
    n = len(names)
    steps = out["steps"]
    payload = b"x" * 99 + b"\n"
    t = time.monotonic()
    passes_s: dict[str, float] = {}
    out["passes_s"] = passes_s
    passes = timed(f"{n}: create, append, seal", steps)(
        lambda: trio.run(
            create_all, node.address, names, payload, lambda i: i >= active, budget, passes_s
        )
    )
    took = time.monotonic() - t
    if passes < 3:
        raise RuntimeError(
            f"creating {n:,} segments did not finish within the {budget:.0f} s budget "
            f"(stopped in pass {passes + 1} of 3: create, append, seal)"
        )
    out["segments_per_s"] = n / took


def run_scale(work: pathlib.Path, s3: Any, env: dict[str, str], n: int,
              follow_seconds: float, budget: float, tier2: str,
              bulk: bool = False) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"segments": n, "steps": {}}
    steps = out["steps"]
    names = scale_names(n)
    active = max(1, n // 100)
    with bucket_of_its_own(s3, f"s{n}") as (bucket, s3c):
        node_id = "node-s"
        config = node_config(node_id, bucket, s3.endpoint_url, 'snapshot_interval = "5s"\n' + tier2)
        node = Daemon(work / f"scale{n}", node_id, config, env)
        follower = Daemon(work / f"scale{n}", "node-f",
                          node_config("node-f", bucket, s3.endpoint_url, ""), env,
                          mount=False)  # fmt: skip
        try:
            if bulk:
                names = bulk_install(node, n, steps)
                steps["first_start_s"] = round(node.start(), 2)
                active_name = names[-1]
            else:
                steps["first_start_s"] = round(node.start(), 2)
                make_segments(node, names, active, budget, out)
                active_name = names[0]
            steps["flushed_wait_s"] = round(wait_for(lambda: flushed(node), "flushed"), 2)
            out["rss_mib_loaded"] = node.rss_mib()
            log(f"{n}: RSS {out['rss_mib_loaded']:.0f} MiB")
            lat = timed(f"{n}: {CHECKPOINT_APPENDS} appends one at a time", steps)(
                lambda: trio.run(one_at_a_time, node.address, active_name, CHECKPOINT_APPENDS)
            )
            med = statistics.median(lat)
            out["checkpoint_stall"] = {
                "append_p50_ms": med * 1e3, "append_max_ms": max(lat) * 1e3,
                "stall_ms": (max(lat) - med) * 1e3,
                "appends_over_10x_p50": sum(x > 10 * med for x in lat),
            }  # fmt: skip
            time.sleep(6)  # a snapshot after the last flush (snapshot_interval 5 s)
            snaps = sorted(objects(s3c, bucket, f"gw/{node_id}/meta/"), key=lambda o: o["Key"])
            snaps = [o for o in snaps if o["Key"].endswith(".snapshot")]
            out["snapshot_bytes"] = snaps[-1]["Size"] if snaps else None
            out["chunk_objects"] = len(objects(s3c, bucket, f"gw/{node_id}/chunks/"))
            steps["stop_s"] = round(node.stop(), 2)
            sizes = timed(f"{n}: journal-dump", steps)(
                lambda: checkpoint_frames(node.dir / "data" / "journal")
            )
            out["checkpoints_in_journal"] = len(sizes)
            out["checkpoint_bytes"] = sizes[-1] if sizes else None
            out["startup_s"] = round(node.start(), 2)
            steps["startup_s"] = out["startup_s"]
            log(f"{n}: startup {out['startup_s']:.1f} s")
            out["rss_mib_restarted"] = node.rss_mib()
            assert node.mountpoint is not None
            one = node.mountpoint / names[-1]
            out["stat_s"] = {"cold": timed_stat(one), "again": timed_stat(one)}
            ls: dict[str, Any] = {}
            for label, path in (("root", node.mountpoint), ("big", node.mountpoint / "big")):
                cold, entries = timed_ls(path)
                warm, _ = timed_ls(path)
                ls[label] = {"entries": entries, "cold_s": cold, "again_s": warm}
            out["ls"] = ls
            log(f"{n}: ls {ls}, stat {out['stat_s']}")
            out["rss_mib_after_ls"] = node.rss_mib()
            # The follower.
            idle = window(node, follow_seconds)
            steps["follower_start_s"] = round(follower.start(), 2)
            key = f'segment_gateway_cluster_remote_segments{{node="{node_id}",tail_available="1"}}'

            def sees_all() -> bool:
                m = follower.metrics()
                return m.get(key, 0) + m.get(key.replace('"1"', '"0"'), 0) >= n

            t = time.monotonic()
            steps["follower_sees_all_s"] = round(wait_for(sees_all, "the follower sees all"), 2)
            out["follower_sees_all_s"] = time.monotonic() - t + steps["follower_start_s"]
            followed = window(node, follow_seconds)
            fcpu0 = follower.cpu_seconds()
            time.sleep(1)
            fcpu1 = follower.cpu_seconds()
            out["follow"] = {
                "window_s": follow_seconds,
                "leader_idle": idle,
                "leader_followed": followed,
                "leader_cpu_share_added": followed["cpu_share"] - idle["cpu_share"],
                "follower_cpu_share": fcpu1 - fcpu0,
                "follower_rss_mib": follower.rss_mib(),
                "list_requests_per_s_estimate": -(-n // LIST_PAGE) / REFRESH_INTERVAL,
            }
            log(f"{n}: follow {out['follow']}")
        except Exception as e:
            out.setdefault("failures", []).append(f"{type(e).__name__}: {e}")
            out["traceback"] = traceback.format_exception(e)[-8:]
            out["daemon_tail"] = node.tail().splitlines()
            log(f"{n} FAILED: {e}")
        finally:
            follower.stop()
            node.stop()
    return out


# -- the report -------------------------------------------------------------------------


def fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "—"
    return format(v, spec)


def ratio(a: float | None, b: float | None) -> str:
    """``a ÷ b`` as a figure for the table."""
    if a is None or b is None or not b:
        return "—"
    return f"{a / b:.2f}×"


def objects_cell(c: dict[str, Any]) -> str:
    return f"{c['median']:g} / {c['mean']:.1f} / {c['max']}"


def trickle_table(result: dict[str, Any]) -> list[str]:
    """The trickle's tables: defrag off against on; the same segments before and after."""
    tr = result["trickle"]
    lines = [TRICKLE_START]
    off, on = tr.get("off", {}), tr.get("on", {})
    if "tier2_requests_per_hour" not in off or "tier2_requests_per_hour" not in on:
        lines += [f"Trickle: FAILED: {'; '.join(tr.get('failures', []))}", TRICKLE_END]
        return lines
    lines += [
        f"Run {result['when']} on {result['machine']}, software {result['version']}: "
        f"{tr['segments']:,} segments, one {len(EVENT)}-byte event a second each for "
        f"{tr['seconds']:.0f} s, `flush_interval` 1 s, once with `tier2.defrag` off and once "
        "on, one after the other in the same run, each on a bucket of its own (defrag on: "
        f"the merge rules at their defaults, `defrag_interval` {DEFRAG_INTERVAL} s, "
        "`gc_grace` 5 s). Objects listed with boto3 once the last flushes, merges and "
        "deletions were done, the segments still active.",
        "",
        "| measure | defrag off | defrag on | on ÷ off |",
        "|---|---|---|---|",
        f"| rounds of appends (late) | {off['load']['rounds']} ({off['load']['rounds_late']}) "
        f"| {on['load']['rounds']} ({on['load']['rounds_late']}) | |",
        "| chunk objects per segment, median / mean / max "
        f"| {objects_cell(off['chunk_objects_per_segment'])} "
        f"| {objects_cell(on['chunk_objects_per_segment'])} "
        f"| {ratio(on['chunk_objects_per_segment']['median'], off['chunk_objects_per_segment']['median'])} |",  # noqa: E501
        f"| mean object, bytes | {off['chunk_objects_per_segment']['bytes_mean']:,.0f} "
        f"| {on['chunk_objects_per_segment']['bytes_mean']:,.0f} | |",
    ]
    ops = sorted(set(off["tier2_requests_per_hour"]) | set(on["tier2_requests_per_hour"]))
    for op in ops:
        a = off["tier2_requests_per_hour"].get(op, 0.0)
        b = on["tier2_requests_per_hour"].get(op, 0.0)
        lines.append(f"| Tier-2 {op} per hour | {a:,.0f} | {b:,.0f} | {ratio(b, a)} |")
    a, b = off["s3_requests_per_hour"], on["s3_requests_per_hour"]
    lines.append(
        f"| S3 requests per hour, all (a concat as its GETs and PUT) | {a:,.0f} | {b:,.0f} "
        f"| {ratio(b, a)} |"
    )
    d = on["defrag_counters"]
    lines += [
        f"| merges (chunks replaced) during the trickle | — | {d['runs']:,.0f} "
        f"({d['chunks_replaced']:,.0f}) | |",
        f"| daemon RSS, MiB | {off['rss_mib']:.0f} | {on['rss_mib']:.0f} | |",
        "",
    ]
    if "after" not in off:
        lines += [f"Before and after: FAILED: {'; '.join(off.get('failures', []))}", TRICKLE_END]
        return lines
    before, after = off["before"], off["after"]
    sealed, packed = off["sealed_objects_per_segment"], off["packed_objects_per_segment"]
    target = 2 + off["bytes_per_segment"] / MAX_CHUNK_SIZE
    pk = off["packing"]
    lines += [
        "The defrag-off run's segments, sealed, then read cold (node started on an empty "
        "cache directory, page cache dropped) before and after the node, started again with "
        f"defrag on, packed them (`{off['bytes_per_segment']:,}` bytes each; the packing "
        f"took {pk['seconds']:.0f} s, {pk['runs']:,.0f} merges replacing "
        f"{pk['chunks_replaced']:,.0f} chunks).",
        "",
        "| measure | before | after | after ÷ before |",
        "|---|---|---|---|",
        f"| chunk objects per segment, median / mean / max | {objects_cell(sealed)} "
        f"| {objects_cell(packed)} | {ratio(packed['median'], sealed['median'])} |",
        f"| target: at most 2 + size ÷ `max_chunk_size` = {target:.2f} per segment "
        f"| {met(sealed['max'] <= target)} | {met(packed['max'] <= target)} | |",
    ]
    if "spark" in before and "spark" in after:
        sb, sa = before["spark"], after["spark"]
        gets_b = sb["tier2_requests"].get("read", 0)
        gets_a = sa["tier2_requests"].get("read", 0)
        lines += [
            f"| cold Spark `read.text(...).count()` (`local[2]`), median of "
            f"{len(sb['runs_s'])}, s | {sb['median_s']:.1f} | {sa['median_s']:.1f} "
            f"| {ratio(sa['median_s'], sb['median_s'])} |",
            f"| its Tier-2 reads | {gets_b:,.0f} | {gets_a:,.0f} | {ratio(gets_a, gets_b)} |",
        ]
    mb, ma = before["mount"], after["mount"]
    lines += [
        f"| cold read through the mount (one file after another), s | {mb['seconds']:.1f} "
        f"| {ma['seconds']:.1f} | {ratio(ma['seconds'], mb['seconds'])} |",
        f"| its Tier-2 reads | {mb['tier2_requests'].get('read', 0):,.0f} "
        f"| {ma['tier2_requests'].get('read', 0):,.0f} | |",
        TRICKLE_END,
    ]
    return lines


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}; one run, "
        "today's code (the baseline before issue 33's changes); SeaweedFS on loopback.",
        "",
    ]
    runs = result["scale"]
    head = "| measure | " + " | ".join(f"{r['segments']:,}" for r in runs) + " |"
    lines += [
        "Scale: segments created (one 100-byte append, 99% sealed), all flushed; "
        "a tenth at the mount's root, the rest in `big/`.",
        "",
        head,
        "|---|" + "---|" * len(runs),
    ]

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> None:
        cells = []
        for r in runs:
            try:
                cells.append(get(r))
            except (KeyError, TypeError):
                cells.append("failed" if r.get("failures") else "—")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("segments made/s (create, append, seal passes; 64 in flight)",
        lambda r: f"{r['segments_per_s']:,.0f}")  # fmt: skip
    row("creates/s (the create pass alone)",
        lambda r: f"{r['segments'] / r['passes_s']['created']:,.0f}")  # fmt: skip
    row("wait until all flushed, s", lambda r: f"{r['steps']['flushed_wait_s']:.1f}")
    row("daemon RSS loaded / after restart, MiB",
        lambda r: f"{r['rss_mib_loaded']:.0f} / {r['rss_mib_restarted']:.0f}")  # fmt: skip
    row("startup to ready, s", lambda r: f"{r['startup_s']:.1f}")
    row("stop (SIGTERM to exit), s", lambda r: f"{r['steps']['stop_s']:.1f}")
    row("checkpoint bytes (last in the journal)", lambda r: f"{r['checkpoint_bytes']:,}")
    row("checkpoint stall: longest append − median, ms",
        lambda r: f"{r['checkpoint_stall']['stall_ms']:.0f} "
        f"(p50 {r['checkpoint_stall']['append_p50_ms']:.1f})")  # fmt: skip
    row("Tier-2 snapshot bytes", lambda r: f"{r['snapshot_bytes']:,}")
    row("`ls` root: entries, cold / again s",
        lambda r: f"{r['ls']['root']['entries']:,}: {r['ls']['root']['cold_s']:.2f} / "
        f"{r['ls']['root']['again_s']:.2f}")  # fmt: skip
    row("`ls big/`: entries, cold / again s",
        lambda r: f"{r['ls']['big']['entries']:,}: {r['ls']['big']['cold_s']:.2f} / "
        f"{r['ls']['big']['again_s']:.2f}")  # fmt: skip
    row(
        "`stat` one segment, cold / again ms",
        lambda r: f"{r['stat_s']['cold'] * 1e3:.1f} / {r['stat_s']['again'] * 1e3:.2f}",
    )
    row("follower: start → shows all, s", lambda r: f"{r['follower_sees_all_s']:.1f}")
    row(
        "follower: leader CPU added (share of a core)",
        lambda r: f"{r['follow']['leader_cpu_share_added']:.2f}",
    )
    row("follower: leader's port, data segments in/s (≈ requests/s)",
        lambda r: f"{r['follow']['leader_followed']['data_segs_in_per_s']:.1f}")  # fmt: skip
    row("follower: leader's port, kB/s out / in",
        lambda r: f"{r['follow']['leader_followed']['bytes_sent_per_s'] / 1e3:,.1f} / "
        f"{r['follow']['leader_followed']['bytes_received_per_s'] / 1e3:,.1f}")  # fmt: skip
    row("follower: its own CPU (share of a core) / RSS MiB",
        lambda r: f"{r['follow']['follower_cpu_share']:.2f} / "
        f"{r['follow']['follower_rss_mib']:.0f}")  # fmt: skip
    row(
        "follower: list requests/s (estimate: pages ÷ refresh 0.5 s)",
        lambda r: f"{r['follow']['list_requests_per_s_estimate']:.0f}",
    )
    failures = [f"{r['segments']:,}: {'; '.join(r['failures'])}" for r in runs
                if r.get("failures")]  # fmt: skip
    if failures:
        lines += ["", "Failures: " + " / ".join(failures)]
    lines.append(TABLE_END)
    return lines


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where the daemons and SeaweedFS write (default: .bench-tmp)",
        repeat=None,
        quick_help="smoke test: 100 trickle segments for 60 s, sizes 10^3 and 10^4",
    )
    parser.add_argument("--trickle-segments", type=int, default=1000)
    parser.add_argument("--trickle-seconds", type=float, default=180.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--million", action="store_true", help="also 10^6 segments")
    parser.add_argument("--follow-seconds", type=float, default=30.0)
    parser.add_argument("--skip-trickle", action="store_true")
    parser.add_argument(
        "--skip-scale",
        action="store_true",
        help="the trickle part only (--write-table then rewrites its table only)",
    )
    parser.add_argument(
        "--spark-repeat",
        type=int,
        default=3,
        help="cold Spark counts before and after defragmentation (median)",
    )
    parser.add_argument("--bulk", action="store_true",
                        help="install each size's segments (tests/helpers/bulk.py: "
                        "sealed, flushed, one shared chunk), not one by one")  # fmt: skip
    parser.add_argument("--create-budget", type=float, default=1500.0,
                        help="seconds each size may spend creating (default 1500)")  # fmt: skip
    parser.add_argument("--tier2-concurrency", type=int, default=32,
                        help="the loaded node's tier2.max_concurrency (default 32; "
                        "creates claim names and seals flush: Tier-2 bound)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.trickle_segments, args.trickle_seconds = 100, 60.0
        args.sizes, args.follow_seconds = [1000, 10_000], 10.0
        args.spark_repeat = 1
    if args.million:
        args.sizes = [*args.sizes, 1_000_000]
    stop_on_signals()
    from gateway.embedded import EmbeddedS3

    began = time.monotonic()
    result: dict[str, Any] = {**result_header("scale"), "quick": bool(args.quick)}
    with work_directory(args.dir, "scale-") as work:
        s3 = EmbeddedS3(work / "s3")
        s3.start()
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        try:
            if not args.skip_trickle:
                result["trickle"] = run_trickle(work, s3, env, args.trickle_segments,
                                                args.trickle_seconds,
                                                args.spark_repeat)  # fmt: skip
            else:
                result["trickle"] = {"failures": ["skipped"]}
            result["scale"] = []
            for n in [] if args.skip_scale else args.sizes:
                t = time.monotonic()
                r = run_scale(work, s3, env, n, args.follow_seconds, args.create_budget,
                              f"max_concurrency = {args.tier2_concurrency}",
                              args.bulk)  # fmt: skip
                r["total_s"] = time.monotonic() - t
                log(f"{n}: done in {r['total_s']:.0f} s")
                result["scale"].append(r)
        finally:
            s3.stop()
    result["total_s"] = time.monotonic() - began
    print_result(result)
    if args.write_table:
        if not args.skip_trickle:
            replace_table(args.write_table, TRICKLE_START, TRICKLE_END, trickle_table(result))
        if not args.skip_scale:
            replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    failed = result["trickle"].get("failures") or any(r.get("failures") for r in result["scale"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
