#!/usr/bin/env python3
"""Read benchmark: the read path against reading a local file, in the same run.

Builds a segment of --size bytes (default 1 GiB) through the container, then:

* reads it sequentially from the cache with 1 MiB and 128 KiB reads, in
  process (``SegmentContainer.read``) and over the protocol from a client in
  another process (``Client.read_pieces`` against a real daemon);
* reads the same bytes from a local file with the same read sizes (the
  baseline; the file is read once first, so it comes from the page cache,
  as warm as the cache's data);
* measures the latency from an append's acknowledgement to a reader waiting
  at the tail getting the bytes (p50/p99), in process.

Prints one JSON document; with --write-table also rewrites the read table in
docs/PERFORMANCE.md. Targets: in-process sequential reads from the cache
≥ 1 GB/s; tail latency p99 ≤ 5 ms.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    TIER2_OFF,
    argument_parser,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    running_daemon,
)

from gateway.config import Config  # noqa: E402
from gateway.node import open_node  # noqa: E402

TABLE_START = "<!-- bench/read.py:start -->"
TABLE_END = "<!-- bench/read.py:end -->"
READ_SIZES = [1024 * 1024, 128 * 1024]
DAEMON_CONFIG = '[cache]\nbudget = "4 GiB"\n[container]\nmax_append_bytes = "8 MiB"\n'
APPEND = 1024 * 1024


def config_for(data_dir: pathlib.Path) -> Config:
    return Config.from_dict(
        {
            "node": {"data_dir": str(data_dir)},
            "cache": {"budget": "4 GiB"},
            "container": {"max_append_bytes": "8 MiB"},
        }
    )


async def build(config: Config, size: int, local: pathlib.Path) -> None:
    block = os.urandom(APPEND)
    async with open_node(config) as node:
        c = node.container
        await (await c.admit(partial(c.prepare_create, "bench/read"), 1024)).wait()
        with local.open("wb") as f:
            for _ in range(size // APPEND):
                await (
                    await c.admit(partial(c.prepare_append, "bench/read", block), APPEND + 1024)
                ).wait()
                f.write(block)


async def read_in_process(config: Config, size: int, read_size: int) -> float:
    async with open_node(config) as node:
        c = node.container
        started = time.perf_counter()
        offset = 0
        while offset < size:
            r = await c.read("bench/read", offset, read_size)
            offset += len(r.data)
        return size / (time.perf_counter() - started) / 1e6


async def tail_latency(config: Config, samples: int) -> list[float]:
    latencies: list[float] = []
    async with open_node(config) as node:
        c = node.container
        await (await c.admit(partial(c.prepare_create, "bench/tail"), 1024)).wait()
        offset = 0
        for i in range(samples):
            got_at: list[float] = []

            async def reader(at: int = offset, got_at: list[float] = got_at) -> None:
                r = await c.read("bench/tail", at, 1 << 20, wait=5.0)
                assert r.data
                got_at.append(time.perf_counter())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.sleep(0.002)
                await (
                    await c.admit(partial(c.prepare_append, "bench/tail", b"e%09d" % i), 1024)
                ).wait()
                acked_at = time.perf_counter()
            # The reader may even run before the appender sees its ack: 0 then.
            latencies.append(max(0.0, got_at[0] - acked_at))
            offset += 10
    return latencies


def read_local(path: pathlib.Path, read_size: int) -> float:
    size = path.stat().st_size
    started = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(read_size):
            pass
    return size / (time.perf_counter() - started) / 1e6


def read_over_protocol(address: str, size: int, read_size: int) -> float:
    """MB/s of a client in another process reading sequentially."""
    code = f"""
import sys, time, trio
sys.path.insert(0, {str(ROOT)!r})
from gateway.client.client import open_client
async def main():
    async with open_client({address!r}) as c:
        t = time.perf_counter(); offset = 0
        while offset < {size}:
            r = await c.read("bench/read", offset, {read_size})
            offset += len(r.data)
        print({size} / (time.perf_counter() - t) / 1e6)
trio.run(main)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=900
    )
    return float(out.stdout.strip())


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, a {result['size'] >> 20} MiB segment "
        f"(1 MiB appends, all in the cache), median of {result['repeat']} runs; "
        f"software {result['version']}.",
        "",
        "| read size | local file (page cache) MB/s | in process MB/s | × local "
        "| over the protocol MB/s | × local |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["sequential"]:
        lines.append(
            f"| {row['read_size'] >> 10} KiB | {row['local_MBps']:.0f} | "
            f"{row['in_process_MBps']:.0f} | {row['in_process_MBps'] / row['local_MBps']:.2f}× | "
            f"{row['protocol_MBps']:.0f} | {row['protocol_MBps'] / row['local_MBps']:.2f}× |"
        )
    t = result["tail"]
    lines += [
        "",
        f"Tail latency (append acknowledged → waiting reader has the bytes, in process, "
        f"{t['samples']} samples): p50 {t['p50_ms']:.2f} ms, p99 {t['p99_ms']:.2f} ms.",
        "",
        f"Targets: in-process sequential reads from the cache ≥ 1 GB/s — best "
        f"{result['targets']['best_in_process_MBps']:.0f} MB/s "
        f"({met(result['targets']['read_met'])}); tail latency p99 ≤ 5 ms — "
        f"{t['p99_ms']:.2f} ms ({met(result['targets']['tail_met'])}).",
        TABLE_END,
    ]
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--tail-samples", type=int, default=500)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=args.dir, prefix="read-"))
    size = args.size // APPEND * APPEND
    try:
        data_dir = work / "node"
        config = config_for(data_dir)
        local = work / "local.bin"
        log("building the segment")
        trio.run(build, config, size, local)
        read_local(local, 1 << 20)  # warm the page cache for the baseline
        runs: dict[int, dict[str, list[float]]] = {
            rs: {"local": [], "in": [], "proto": []} for rs in READ_SIZES
        }
        for rep in range(args.repeat):
            for rs in READ_SIZES:
                runs[rs]["local"].append(read_local(local, rs))
                runs[rs]["in"].append(trio.run(read_in_process, config, size, rs))
                print(f"bench: rep {rep} {rs >> 10} KiB: local {runs[rs]['local'][-1]:.0f} "
                      f"in-process {runs[rs]['in'][-1]:.0f} MB/s", file=sys.stderr)  # fmt: skip
        with running_daemon(work, DAEMON_CONFIG + TIER2_OFF.format(root=work), data_dir) as address:
            for rep in range(args.repeat):
                for rs in READ_SIZES:
                    runs[rs]["proto"].append(read_over_protocol(address, size, rs))
                    print(f"bench: rep {rep} {rs >> 10} KiB over the protocol: "
                          f"{runs[rs]['proto'][-1]:.0f} MB/s", file=sys.stderr)  # fmt: skip
        lat = sorted(trio.run(tail_latency, config, args.tail_samples))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sequential = [
        {
            "read_size": rs,
            "local_MBps": statistics.median(runs[rs]["local"]),
            "in_process_MBps": statistics.median(runs[rs]["in"]),
            "protocol_MBps": statistics.median(runs[rs]["proto"]),
        }
        for rs in READ_SIZES
    ]
    tail = {
        "samples": len(lat),
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }
    best = max(r["in_process_MBps"] for r in sequential)
    result = {
        **result_header("read"),
        "size": size,
        "repeat": args.repeat,
        "sequential": sequential,
        "tail": tail,
        "targets": {
            "best_in_process_MBps": best,
            "read_met": best >= 1000,
            "tail_met": tail["p99_ms"] <= 5,
        },
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
