"""The daemons, buckets and helpers `bench/scale.py` and `bench/scale_trickle.py` share.

One gateway daemon on fixed loopback ports with its mount and metrics, a
bucket of its own on the run's SeaweedFS, the pipelined client that makes
segments, and the table cells.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    log,
)
from replication import free_port  # noqa: E402

from gateway.client.client import open_client  # noqa: E402

TABLE_START = "<!-- bench/scale.py:start -->"
TABLE_END = "<!-- bench/scale.py:end -->"
READY_TIMEOUT = 600.0
STOP_TIMEOUT = 300.0
SETTLE_TIMEOUT = 1800.0
EVENT = b'{"sensor":"s0000","t":0000000000,"v":0.0000000000000000000000}\n'  # 63 bytes
TASKS = 64
CONNECTIONS = 4
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
