#!/usr/bin/env python3
"""Following another node: a full listing per refresh against the change feed, same run.

One real daemon (filesystem Tier 2, no flushes) holds N segments (--counts,
default 10, 2,000 and 10,000). A follower in this process (`RemoteNode`, as
every node's mount uses it, over one protocol connection) refreshes its view
--refreshes times (default 20), one small append to one segment before
each, in two modes: **listing** -- the owner hidden behind a client that
does not name the change feed in Hello, so the follower lists it in full
and fetches the records that changed, as every refresh did before the feed
(and as it still does with an older owner) -- and **feed** (changes since
its cursor). Per refresh: the follower's CPU (this process), the owner's
CPU (``/proc/PID/stat`` of the daemon; 10 ms ticks, summed over the
refreshes), the requests sent by kind and the records received. Target: with
the feed, no figure grows with the unchanged segments.
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import trio
from common import (
    TIER2_OFF,
    argument_parser,
    log,
    print_result,
    replace_table,
    result_header,
    running_daemon,
    stop_on_signals,
    work_directory,
)

from gateway.client.client import Client, open_client
from gateway.cluster.remote import MountIds, RemoteNode
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage

TICK = 0.01  # seconds per /proc clock tick (USER_HZ 100)
TABLE_START = "<!-- bench/follow.py:start -->"
TABLE_END = "<!-- bench/follow.py:end -->"
SECTION = """
## Following another node: `bench/follow.py`

What one node costs another by following it (its mount shows the other's
segments), per refresh (every `cluster.refresh_interval`, 0.5 s by default),
with one segment changing between refreshes: before the change feed (a full
listing, then the records that changed: what a follower still does with an
owner of an older version) and with it, in the same run. The follower runs
in the benchmark's process (`RemoteNode` over one connection); the owner is
a real daemon.

"""


class Counting:
    """A client that counts the requests a follower sends (and, as an owner from
    before the feed, can hide it)."""

    def __init__(self, client: Client, feed: bool) -> None:
        self.client = client
        self.feed = feed
        self.asked: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.asked[kind] = self.asked.get(kind, 0) + 1

    def serves(self, kind: str) -> bool:
        return self.feed and self.client.serves(kind)

    async def changes(self, *args: Any, **kwargs: Any) -> Any:
        self._count("changes")
        return await self.client.changes(*args, **kwargs)

    async def list(self, *args: Any, **kwargs: Any) -> Any:
        self._count("list")
        return await self.client.list(*args, **kwargs)

    async def record(self, name: str) -> Any:
        self._count("get_record")
        return await self.client.record(name)

    async def stream_names(self) -> Any:
        self._count("stream")
        return await self.client.stream_names()


def daemon_pid(config: pathlib.Path) -> int:
    """The daemon started with ``config`` (its command line names the file)."""
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(config).encode() in cmdline and b"serve" in cmdline:
                return int(proc.name)
    raise RuntimeError("the daemon's process was not found")


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK  # utime, stime


async def make_segments(address: str, count: int) -> None:
    async with open_client(address) as client:

        async def some(start: int) -> None:
            for i in range(start, count, 64):
                await client.create(f"f/{i:06}")

        async with trio.open_nursery() as nursery:
            for start in range(min(64, count)):
                nursery.start_soon(some, start)


async def follow(address: str, pid: int, feed: bool, refreshes: int) -> dict[str, float]:
    async with open_client(address) as client:
        counting = Counting(client, feed)
        follower: Any = counting
        node = RemoteNode("owner", ChunkLayer(MemoryStorage(), retry_deadline=5.0), None,
                          MountIds())  # fmt: skip
        await node.refresh_live(follower)  # the first: a listing either way
        counting.asked.clear()
        records0 = node.records_fetched + node.feed_records
        cpu = wall = 0.0
        owner0 = cpu_seconds(pid)
        for _ in range(refreshes):
            await client.append("f/000000", b"x")
            c, w = time.process_time(), time.perf_counter()
            await node.refresh_live(follower)
            cpu += time.process_time() - c
            wall += time.perf_counter() - w
        owner = cpu_seconds(pid) - owner0
        seg = node.by_name("f/000000")
        want = (await client.info("f/000000")).length
        assert seg is not None and seg.length == want, "the follower missed an append"
        out = {
            "follower_cpu_ms": 1000 * cpu / refreshes,
            "refresh_ms": 1000 * wall / refreshes,
            "owner_cpu_ms": 1000 * owner / refreshes,
            "records": (node.records_fetched + node.feed_records - records0) / refreshes,
        }
        for kind in ("list", "get_record", "changes", "stream"):
            out[f"{kind}_requests"] = counting.asked.get(kind, 0) / refreshes
        return out


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    """Rewrite the section's table in ``path`` (add the section at the end if missing)."""
    runs = {(r["segments"], r["mode"]): r for r in result["runs"]}
    counts = sorted({r["segments"] for r in result["runs"]})
    head = " | ".join(f"{n:,}: listing | {n:,}: feed" for n in counts)
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}; "
        f"one run, {result['refreshes']} refreshes per mode, each after one append.",
        "",
        f"| per refresh | {head} |",
        "|---|" + "---|---|" * len(counts),
    ]
    rows = (
        ("follower CPU, ms", "follower_cpu_ms", "{:.2f}"),
        ("owner CPU, ms (10 ms ticks, averaged)", "owner_cpu_ms", "{:.1f}"),
        ("refresh, wall ms", "refresh_ms", "{:.1f}"),
        ("`list` requests (pages)", "list_requests", "{:g}"),
        ("`get_record` requests", "get_record_requests", "{:g}"),
        ("`stream` (names) requests", "stream_requests", "{:g}"),
        ("`changes` requests", "changes_requests", "{:g}"),
        ("records received", "records", "{:g}"),
    )
    for label, key, form in rows:
        cells = " | ".join(
            form.format(runs[n, mode][key]) for n in counts for mode in ("listing", "feed")
        )
        lines.append(f"| {label} | {cells} |")
    lines.append(TABLE_END)
    if TABLE_START not in path.read_text():
        path.write_text(path.read_text().rstrip("\n") + "\n" + SECTION + TABLE_START + TABLE_END)
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> None:
    parser = argument_parser(__doc__, repeat=None, quick_help="10 and 2,000 segments only")
    parser.add_argument("--counts", default="10,2000,10000")
    parser.add_argument("--refreshes", type=int, default=20)
    args = parser.parse_args()
    stop_on_signals()
    counts = [10, 2000] if args.quick else [int(n) for n in args.counts.split(",")]
    result = result_header("follow")
    result["refreshes"] = args.refreshes
    runs = []
    for count in counts:
        with work_directory(args.dir, "follow-") as work:
            config = TIER2_OFF.format(root=work)
            with running_daemon(work, config) as address:
                pid = daemon_pid(work / "gateway.toml")
                log(f"{count} segments")
                trio.run(make_segments, address, count)
                for mode in ("listing", "feed"):
                    got = trio.run(follow, address, pid, mode == "feed", args.refreshes)
                    log(f"{count} segments, {mode}: {got}")
                    runs.append({"segments": count, "mode": mode, **got})
    result["runs"] = runs
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)


if __name__ == "__main__":
    main()
