#!/usr/bin/env python3
"""Replicated journal benchmark: appends acknowledged by 2 of 3 copies against local only.

One SeaweedFS (`gateway.embedded.EmbeddedS3`) and, running side by side for
the whole run, gateway daemons that differ only in ``[replication]``:

- *local only*: one daemon (``write_quorum = 1``) alone on a bucket of its own;
- *replicated*: three daemons on loopback sharing another bucket, each with
  ``write_quorum = 3, ack_quorum = 2`` (other replication keys at their
  defaults: ``peer_timeout = "3s"``); the load goes to node-a, whose journal
  is also written by node-b and node-c, and an append is acknowledged once
  node-a's copy and one replica are fdatasync'd.

Tier 2 never flushes during a run (``flush_interval = "24h"``, 5 GiB chunks),
so the figures are the journal's and the replicas'. The cases, all from this
process over the wire protocol:

- **1 KiB x 64 writers**: 64 connections, one writer each, one append in
  flight per connection (each awaits its acknowledgement before the next),
  each writer on a segment of its own, for --seconds: appends/s, MB/s and
  the latency of every append (sent -> acknowledged), p50 and p99.
- **1 MiB appends**: --total MiB on one connection with 16 appends in
  flight: MB/s, and the CPU time the daemons used per MiB (/proc: the one
  daemon, or node-a, b and c together) with how busy the whole machine was.
- **1 KiB x 64 with a replica stopped**: node-c gets SIGSTOP right before the
  case starts and SIGCONT after it, --stopped-seconds later (long enough for
  ``peer_timeout`` to take it out of node-a's ensemble: an ensemble change);
  then the run waits until it has caught up and is back in the ensemble.

The physical reference for 1 MiB, measured in the same directory right
before each 1 MiB case: fio writing the same --total bytes three times at
once (three jobs, sequential 1 MiB writes with an fdatasync after each, like
three journals on the one disk the three nodes share here); its reference
rate is the jobs' aggregate bandwidth ÷ 3, the rate of user bytes three
copies allow. fio writing them once is the local-only reference.

Targets: p99 (replicated) ≤ 3x p99 (local only) for 1 KiB x 64; 1 MiB
replicated ≥ 0.8x the three-copy fio reference; with a replica stopped,
1 KiB x 64 throughput ≥ 0.9x the healthy replicated one (the noise allowed
on this shared machine), p99 within the same 3x of local only.

The machine is shared and noisy, so each ratio is taken between two cases
run back to back (local only and replicated 1 KiB; healthy and stopped;
fio and its 1 MiB case) in every repetition, the order alternating, and
the medians of --repeat repetitions are reported. Prints one JSON document
(progress on stderr); --write-table rewrites the section of
docs/PERFORMANCE.md. --quick: one repetition of 1 s cases and 16 MiB, a
smoke test (about 20 s).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
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
    READY_TIMEOUT,
    STOP_TIMEOUT,
    argument_parser,
    ensure_fio,
    log,
    median_of,
    met,
    print_result,
    replace_table,
    result_header,
    run_fio,
    stop_on_signals,
    work_directory,
)

from gateway.client.client import ResponseFuture, open_client  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
WRITERS = 64
INFLIGHT = 16
TARGET_P99_RATIO = 3.0
TARGET_MIB_VS_FIO = 0.8
TARGET_STOPPED_RATIO = 0.9
SETTLE_TIMEOUT = 90.0
TABLE_START = "<!-- bench/replication.py:start -->"
TABLE_END = "<!-- bench/replication.py:end -->"
CLUSTER = ("node-a", "node-b", "node-c")


# -- the daemons --------------------------------------------------------------------


def node_config(node: str, bucket: str, endpoint: str, replication: str) -> str:
    """A node on ``bucket``; Tier 2 never flushes during a run; ``replication`` as given."""
    return f"""
[node]
id = "{node}"
[container]
max_append_bytes = "8 MiB"
[cache]
budget = "8 GiB"
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
flush_interval = "24h"
flush_size = "5 GiB"
max_chunk_size = "5 GiB"
[replication]
{replication}
"""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One daemon on fixed loopback ports (its peers and its metrics are found there)."""

    def __init__(self, root: pathlib.Path, name: str, config: str, env: dict[str, str]) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.config = self.dir / "gateway.toml"
        self.config.write_text(config)
        self.env = env
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_port = free_port()
        self.ready = self.dir / "ready"
        self.log_path = self.dir / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (`wait_ready` waits for it)."""
        command = [
            sys.executable, "-m", "gateway.cli", "--config", str(self.config),
            "serve", "--data-dir", str(self.dir / "data"), "--listen", self.address,
            "--ready-file", str(self.ready), "--mountpoint", "",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
        ]  # fmt: skip
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self) -> None:
        """Until its ready file appears (an error if it exits or takes too long)."""
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready in {READY_TIMEOUT:.0f}s:\n{self.tail()}")
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """Its /metrics samples by name and labels as printed (``x{a="1",b="2"}``)."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the daemon (SIGSTOP, SIGCONT)."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self) -> None:
        """SIGCONT (it may be stopped), SIGTERM; SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in time; killing it")
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def replication_settled(node: Node, peers: int) -> bool:
    """Whether ``node`` has ``peers`` ensemble members, all answering, none behind."""
    m = node.metrics()
    if m.get("segment_gateway_replication_quorum") != 1:
        return False
    if m.get("segment_gateway_replication_ensemble_size", 0) < peers:
        return False
    up = [v for k, v in m.items() if k.startswith("segment_gateway_replication_peer_up{")]
    lag = [
        v for k, v in m.items() if k.startswith("segment_gateway_replication_peer_lag_operations{")
    ]
    return len(up) >= peers and all(v == 1 for v in up) and all(v == 0 for v in lag)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = SETTLE_TIMEOUT) -> None:
    """Poll ``predicate`` every 0.1 s until true; an error after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} within {timeout:.0f}s")
        time.sleep(0.1)


@contextlib.contextmanager
def running_nodes(work: pathlib.Path) -> Iterator[tuple[Node, dict[str, Node]]]:
    """SeaweedFS, the local-only daemon and the three replicating ones, all ready."""
    from gateway.embedded import EmbeddedS3
    from gateway.storage.s3 import S3Storage

    s3 = EmbeddedS3(work / "s3")
    s3.start()
    nodes: list[Node] = []
    try:
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        buckets = [f"bench-rep-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        for b in buckets:
            storage = S3Storage(b, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                                secret_key=s3.secret_key)  # fmt: skip
            storage.create_bucket_if_missing()
            storage.close()
        local = Node(work, "local", node_config("local", buckets[0], s3.endpoint_url,
                                                "write_quorum = 1"), env)  # fmt: skip
        replicated = "write_quorum = 3\nack_quorum = 2"
        cluster = {
            n: Node(work, n, node_config(n, buckets[1], s3.endpoint_url, replicated), env)
            for n in CLUSTER
        }
        nodes = [local, *cluster.values()]
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait_ready()
        wait_until(lambda: replication_settled(cluster["node-a"], 2), "node-a's ensemble full")
        yield local, cluster
    finally:
        for n in nodes:
            n.stop()
        s3.stop()


# -- the cases ----------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


async def run_small(address: str, tag: str, seconds: float) -> dict[str, float]:
    """64 connections, each appending 1 KiB to its own segment, one append in flight."""
    names = [f"bench/{tag}/w{k}" for k in range(WRITERS)]
    payload = b"x" * (KIB - 1) + b"\n"
    perf = time.perf_counter
    latencies: list[float] = []
    counts: list[int] = []
    finished: list[float] = []
    ready, go = trio.Event(), trio.Event()
    connected = 0
    started = stop_at = 0.0

    async def writer(name: str) -> None:
        nonlocal connected
        async with open_client(address) as c:
            await c.create(name)
            await c.append(name, payload)  # the segment exists everywhere it will
            connected += 1
            if connected == WRITERS:
                ready.set()
            await go.wait()
            n = 0
            mine: list[float] = []
            while (sent := perf()) < stop_at:
                await c.append(name, payload)
                mine.append(perf() - sent)
                n += 1
            finished.append(perf())
            latencies.extend(mine)
            counts.append(n)
            if (await c.info(name)).length != (n + 1) * KIB:
                raise RuntimeError(f"{name}: not every acknowledged append reads back")
            await c.delete(name)  # nothing left to flush when the daemons stop

    with trio.fail_after(seconds + 180):
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(writer, name)
            await ready.wait()
            started = perf()
            stop_at = started + seconds
            go.set()
    elapsed = max(finished) - started
    latencies.sort()
    total = sum(counts)
    return {
        "appends_per_s": total / elapsed,
        "MBps": total * KIB / elapsed / 1e6,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "max_ms": latencies[-1] * 1e3 if latencies else float("nan"),
    }


async def run_large(address: str, tag: str, total: int) -> dict[str, float]:
    """``total`` bytes of 1 MiB appends on one connection, 16 in flight."""
    segment = f"bench/{tag}/large"
    data = os.urandom(MIB)
    perf = time.perf_counter
    latencies: list[float] = []
    slots = trio.Semaphore(INFLIGHT)
    send, receive = trio.open_memory_channel[tuple[ResponseFuture, float]](INFLIGHT)

    async def acknowledgements() -> None:
        async with receive:
            async for fut, sent in receive:
                await fut.wait()
                latencies.append(perf() - sent)
                slots.release()

    with trio.fail_after(600):
        async with open_client(address) as client:
            await client.create(segment)
            started = perf()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acknowledgements)
                async with send:
                    for _ in range(total // MIB):
                        await slots.acquire()
                        await send.send((await client.start_append(segment, data), perf()))
            elapsed = perf() - started
            if (await client.info(segment)).length != total:
                raise RuntimeError(f"{segment}: not every acknowledged append reads back")
            await client.delete(segment)
    latencies.sort()
    return {
        "MBps": total / elapsed / 1e6,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
    }


def run_fio_copies(fio: str, directory: pathlib.Path, size_mib: int, jobs: int) -> float:
    """MB/s of user bytes when ``jobs`` fio jobs each write ``size_mib`` (aggregate ÷ jobs)."""
    if jobs == 1:
        return run_fio(fio, directory, "1M", f"{size_mib}M")["MBps"]
    import json
    import shutil
    import tempfile

    work = pathlib.Path(tempfile.mkdtemp(dir=directory, prefix="fio-"))
    try:
        out = subprocess.run(
            [
                fio, "--name=copies", f"--directory={work}", "--rw=write", "--bs=1M",
                f"--size={size_mib}M", f"--numjobs={jobs}", "--group_reporting",
                "--fdatasync=1", "--ioengine=psync", "--output-format=json",
            ],
            check=True, capture_output=True, text=True, timeout=600,
        ).stdout  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return float(json.loads(out)["jobs"][0]["write"]["bw_bytes"]) / 1e6 / jobs


# -- one repetition -----------------------------------------------------------------


def cpu_seconds(node: Node) -> float:
    """CPU time (user + system) the daemon has used so far."""
    assert node.proc is not None
    fields = pathlib.Path(f"/proc/{node.proc.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat)."""
    values = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def measure(
    local: Node, cluster: dict[str, Node], fio: str, work: pathlib.Path, rep: int,
    seconds: float, stopped_seconds: float, total_mib: int,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Every case once, each ratio's two sides back to back, the order alternating with ``rep``."""
    a, c = cluster["node-a"], cluster["node-c"]
    out: dict[str, dict[str, float]] = {}

    def small(label: str, node: Node) -> None:
        out[f"{label}_1KiB"] = trio.run(run_small, node.address, f"r{rep}-{label}", seconds)
        log(f"rep {rep} {label} 1 KiB x {WRITERS}: {_brief(out[f'{label}_1KiB'])}")

    def stopped() -> None:
        changes = "segment_gateway_replication_ensemble_changes_total"
        before = a.metrics().get(changes, 0)
        c.signal(signal.SIGSTOP)
        try:
            r = trio.run(run_small, a.address, f"r{rep}-stopped", stopped_seconds)
        finally:
            c.signal(signal.SIGCONT)
        r["ensemble_changes"] = a.metrics().get(changes, 0) - before
        out["stopped_1KiB"] = r
        log(f"rep {rep} replicated, node-c stopped, 1 KiB x {WRITERS}: {_brief(r)}")
        resumed = time.monotonic()
        wait_until(lambda: replication_settled(a, 2), "node-c back in node-a's ensemble")
        r["back_s"] = time.monotonic() - resumed
        log(f"rep {rep} node-c caught up and back in {r['back_s']:.1f} s")

    def large(label: str, nodes: list[Node], copies: int) -> None:
        out[f"fio_{copies}"] = {"MBps": run_fio_copies(fio, work, total_mib, copies)}
        cpu = [cpu_seconds(n) for n in nodes]
        busy, jiffies = machine_busy()
        r = trio.run(run_large, nodes[0].address, f"r{rep}-{label}", total_mib * MIB)
        busy2, jiffies2 = machine_busy()
        used = [cpu_seconds(n) - before for n, before in zip(nodes, cpu, strict=True)]
        r["cpu_ms_per_MiB"] = sum(used) / total_mib * 1e3
        r["source_cpu_ms_per_MiB"] = used[0] / total_mib * 1e3
        r["machine_busy"] = (busy2 - busy) / max(1, jiffies2 - jiffies)
        out[f"{label}_1MiB"] = r
        log(f"rep {rep} fio x{copies} {out[f'fio_{copies}']['MBps']:.0f} MB/s; "
            f"{label} 1 MiB: {_brief(r)}")  # fmt: skip
        if label == "replicated":
            wait_until(lambda: replication_settled(a, 2), "replicas caught up")

    if rep % 2 == 0:
        small("local", local)
        small("replicated", a)
        stopped()
        large("local", [local], 1)
        large("replicated", [a, cluster["node-b"], c], 3)
    else:
        small("replicated", a)
        stopped()
        small("local", local)
        large("replicated", [a, cluster["node-b"], c], 3)
        large("local", [local], 1)
    return out


def _brief(r: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:,.1f}" for k, v in r.items())


# -- the report ---------------------------------------------------------------------


def run_ratios(run: dict[str, dict[str, float]]) -> dict[str, float]:
    """One repetition's ratios, each between two cases measured back to back."""
    lo, rep, st = run["local_1KiB"], run["replicated_1KiB"], run["stopped_1KiB"]
    return {
        "p99_replicated_vs_local": rep["p99_ms"] / lo["p99_ms"],
        "throughput_1KiB_replicated_vs_local": rep["appends_per_s"] / lo["appends_per_s"],
        "MiB_local_vs_fio_1_copy": run["local_1MiB"]["MBps"] / run["fio_1"]["MBps"],
        "MiB_replicated_vs_fio_3_copies": run["replicated_1MiB"]["MBps"] / run["fio_3"]["MBps"],
        "MiB_replicated_vs_local": run["replicated_1MiB"]["MBps"] / run["local_1MiB"]["MBps"],
        "stopped_vs_replicated_throughput": st["appends_per_s"] / rep["appends_per_s"],
        "stopped_vs_replicated_p99": st["p99_ms"] / rep["p99_ms"],
        "p99_stopped_vs_local": st["p99_ms"] / lo["p99_ms"],
    }


def summarize(runs: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Medians of the repetitions' figures and of their ratios; the targets."""
    med = {case: median_of([r[case] for r in runs]) for case in runs[0]}
    per_run = [run_ratios(r) for r in runs]
    ratios = median_of(per_run)
    targets = {
        "p99_1KiB": {
            "target": f"1 KiB × {WRITERS} writers: p99 (3/2) ≤ {TARGET_P99_RATIO:g}× local only",
            "ratio": ratios["p99_replicated_vs_local"],
            "met": ratios["p99_replicated_vs_local"] <= TARGET_P99_RATIO,
        },
        "throughput_1MiB": {
            "target": f"1 MiB (3/2) ≥ {TARGET_MIB_VS_FIO:g}× fio writing the bytes three times",
            "ratio": ratios["MiB_replicated_vs_fio_3_copies"],
            "met": ratios["MiB_replicated_vs_fio_3_copies"] >= TARGET_MIB_VS_FIO,
        },
        "replica_stopped": {
            "target": f"a replica SIGSTOPped: 1 KiB throughput ≥ {TARGET_STOPPED_RATIO:g}× "
            f"healthy (3/2), p99 ≤ {TARGET_P99_RATIO:g}× local only",
            "ratio": ratios["stopped_vs_replicated_throughput"],
            "met": ratios["stopped_vs_replicated_throughput"] >= TARGET_STOPPED_RATIO
            and ratios["p99_stopped_vs_local"] <= TARGET_P99_RATIO,
        },
    }
    return {
        "cases": med,
        "ratios": ratios,
        "targets": targets,
        "runs": runs,
        "run_ratios": per_run,
    }


def table(result: dict[str, Any]) -> list[str]:
    c, r, t = result["cases"], result["ratios"], result["targets"]

    def small(label: str, row: dict[str, float]) -> str:
        return (f"| {label} | {row['appends_per_s']:,.0f} | {row['MBps']:.1f} "
                f"| {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_ms']:.0f} |")  # fmt: skip

    def large(label: str, row: dict[str, float], vs: str) -> str:
        return (f"| {label} | {row['MBps']:.0f} | {vs} | {row['p50_ms']:.0f} "
                f"| {row['p99_ms']:.0f} | {row['cpu_ms_per_MiB']:.1f} "
                f"| {row['machine_busy']:.0%} |")  # fmt: skip

    return [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}; medians of "
        f"{result['repeat']} repetitions, 1 KiB cases {result['seconds']:g} s each (stopped: "
        f"{result['stopped_seconds']:g} s), 1 MiB "
        f"cases {result['total_mib']} MiB each; ratios are medians of each repetition's "
        "ratio between two cases run back to back.",
        "",
        f"1 KiB appends, {WRITERS} writers (one connection each, one append in flight):",
        "",
        "| configuration | appends/s | MB/s | p50 ack ms | p99 ack ms | max ack ms |",
        "|---|---|---|---|---|---|",
        small("local only (`write_quorum = 1`)", c["local_1KiB"]),
        small("replicated (`write_quorum = 3, ack_quorum = 2`)", c["replicated_1KiB"]),
        small("replicated, node-c SIGSTOPped", c["stopped_1KiB"]),
        "",
        f"p99 replicated ÷ local only: {r['p99_replicated_vs_local']:.2f}×; throughput "
        f"{r['throughput_1KiB_replicated_vs_local']:.2f}×. With node-c stopped ÷ healthy: "
        f"throughput {r['stopped_vs_replicated_throughput']:.2f}×, p99 "
        f"{r['stopped_vs_replicated_p99']:.2f}× ({r['p99_stopped_vs_local']:.2f}× local only); "
        f"node-a's ensemble changes while node-c was stopped: "
        f"{c['stopped_1KiB']['ensemble_changes']:g}; node-c back in the ensemble "
        f"{c['stopped_1KiB']['back_s']:.0f} s after SIGCONT.",
        "",
        f"1 MiB appends ({INFLIGHT} in flight on one connection) and fio 1 MiB writes + "
        "fdatasync on the same directory just before each:",
        "",
        "| configuration | MB/s | × fio | p50 ack ms | p99 ack ms | daemons' CPU ms per MiB "
        "| machine busy |",
        "|---|---|---|---|---|---|---|",
        f"| fio, the bytes once | {c['fio_1']['MBps']:.0f} | | | | | |",
        f"| fio, three jobs at once (user bytes: aggregate ÷ 3) | {c['fio_3']['MBps']:.0f} "
        "| | | | | |",
        large("local only", c["local_1MiB"], f"{r['MiB_local_vs_fio_1_copy']:.2f}× (once)"),
        large(
            "replicated (node-a, b and c)",
            c["replicated_1MiB"],
            f"{r['MiB_replicated_vs_fio_3_copies']:.2f}× (three)",
        ),
        "",
        "Targets: "
        + "; ".join(f"{v['target']} — {v['ratio']:.2f}× ({met(v['met'])})" for v in t.values())
        + ".",
        TABLE_END,
    ]


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where the daemons, SeaweedFS and fio write (default: .bench-tmp)",
        repeat=4,
        repeat_help="repetitions of every case (default 4)",
        quick_help="smoke test: one repetition, 1 s cases, 16 MiB",
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="per 1 KiB case (default 4)")
    parser.add_argument("--total", type=int, default=256, help="MiB per 1 MiB case (default 256)")
    parser.add_argument("--stopped-seconds", type=float, default=8.0,
                        help="the case with a replica stopped (default 8: peer_timeout, 3 s, "
                        "and the ensemble change happen within it)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.stopped_seconds, args.total, args.repeat = 1.0, 1.0, 16, 1
    stop_on_signals()
    fio = ensure_fio()
    runs: list[dict[str, dict[str, float]]] = []
    with work_directory(args.dir, "replication-") as work:
        started = time.monotonic()
        with running_nodes(work) as (local, cluster):
            log(f"four daemons ready, node-a's ensemble full in {time.monotonic() - started:.1f} s")
            for rep in range(args.repeat):
                runs.append(measure(local, cluster, fio, work, rep, args.seconds,
                                    args.stopped_seconds, args.total))  # fmt: skip
    result = {
        **result_header("replication"),
        "seconds": args.seconds,
        "stopped_seconds": args.stopped_seconds,
        "total_mib": args.total,
        "repeat": args.repeat,
        "writers_1KiB": WRITERS,
        "inflight_1MiB": INFLIGHT,
        **summarize(runs),
    }
    print_result(result)
    if args.write_table:
        replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
