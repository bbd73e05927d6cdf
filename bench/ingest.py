#!/usr/bin/env python3
"""Ingest benchmark: events and appends over loopback TCP into a real daemon.

Each configuration starts its own daemon (``segment-gateway serve``, a
separate process, fresh data directory on the same filesystem as --dir) and
drives it from this process over the wire protocol:

- Events through `gateway.client.writer.SegmentWriter` (``lines`` codec, default
  writer settings) for 100 B and 1 KiB events: 1 writer to 1 segment, 16
  writers to 16 segments (one each) and 16 writers sharing 1 segment. The
  writers are trio tasks in this process, writing as fast as they can for
  --seconds; the clock stops when everything written has been acknowledged
  (the final flush). It measures events/s, MB/s of event payload and ack
  latency: every 500th event's number and write time are noted and one
  background task, polling the writers' ``acked_event`` every 0.5 ms, turns
  them into latencies (write called -> known stored) when they are acked.
- 1 MiB appends through `gateway.client.client.Client.start_append` on one
  connection, with 1 and with 16 appends in flight: appends/s, MB/s and
  per-append latency (send started -> acknowledged).

The baseline, measured in the same run on the same directory, is fio doing
sequential 1 MiB writes with an fdatasync after each (as in bench/journal.py);
fio runs are interleaved with the cases on every repeat and medians of the
repeats are reported, because the machines are shared and noisy.

Prints one JSON document (progress on stderr); with --write-table also
rewrites the ingest section of docs/PERFORMANCE.md. --quick (1 run of 1 s)
checks that it works end to end.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    TIER2_OFF,
    argument_parser,
    ensure_fio,
    log,
    median_of,
    met,
    print_result,
    replace_table,
    result_header,
    run_fio,
    running_daemon,
    stop_on_signals,
    work_directory,
)

from gateway.client.client import ResponseFuture, open_client  # noqa: E402
from gateway.client.writer import SegmentWriter, open_segment_writer  # noqa: E402

EVENT_SIZES = [100, 1024]
#: (writers, segments): 1 -> 1, 16 -> 16 (one each), 16 -> 1 (shared).
WRITER_LAYOUTS = [(1, 1), (16, 16), (16, 1)]
MIB = 1024 * 1024
INFLIGHT = [1, 16]
SAMPLE_EVERY = 500  # events between two latency samples (and deadline checks)
POLL_INTERVAL = 0.0005  # seconds between two looks at the writers' acked_event
#: Tier 2 is off, so every byte stays unflushed: a budget whose pinned share
#: (half) is more than a run writes, so no case is throttled by it.
DAEMON_CONFIG = '[container]\nmax_append_bytes = "8 MiB"\n[cache]\nbudget = "16 GiB"\n'
TABLE_START = "<!-- bench/ingest.py:start -->"
TABLE_END = "<!-- bench/ingest.py:end -->"
TARGET_EVENTS = 500_000
TARGET_EVENTS_P99_MS = 20.0
TARGET_MIB_VS_FIO = 0.7


def measure(
    root: pathlib.Path, name: str, fn: Callable[..., Awaitable[dict[str, float]]], *args: Any
) -> dict[str, float]:
    """``trio.run(fn, address, *args)`` against a daemon of its own, then clean up."""
    work = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=f"{name}-"))
    try:
        with running_daemon(work, DAEMON_CONFIG + TIER2_OFF.format(root=work)) as address:
            return trio.run(fn, address, *args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the cases ----------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


@dataclass
class _Watched:
    writer: SegmentWriter
    #: (event number, time write was called), oldest first, not yet acknowledged.
    samples: deque[tuple[int, float]]


async def run_events(
    address: str, size: int, writers: int, segments: int, seconds: float
) -> dict[str, float]:
    """``writers`` SegmentWriters writing ``size``-byte events as fast as they can."""
    names = [f"bench/events-{k}" for k in range(segments)]
    async with open_client(address) as client:
        for n in names:
            await client.create(n)
    event = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    perf = time.perf_counter
    watched: list[_Watched] = []
    latencies: list[float] = []
    all_ready, go = trio.Event(), trio.Event()
    stop_at = 0.0
    written = appends = 0
    finished: list[float] = []

    def collect() -> None:
        now = perf()
        for w in watched:
            acked, samples = w.writer.acked_event, w.samples
            while samples and samples[0][0] <= acked:
                latencies.append(now - samples.popleft()[1])

    async def poll_acks() -> None:
        while True:
            collect()
            await trio.sleep(POLL_INTERVAL)

    async def writer(k: int) -> None:
        nonlocal written, appends
        async with open_segment_writer(address, names[k % segments], codec="lines") as w:
            samples: deque[tuple[int, float]] = deque()
            watched.append(_Watched(w, samples))
            if len(watched) == writers:
                all_ready.set()
            await go.wait()
            write = w.write
            count = 0
            while True:
                now = perf()
                if now >= stop_at:
                    break
                samples.append((w.next_event_number, now))
                for _ in range(SAMPLE_EVERY):
                    await write(event)
                count += SAMPLE_EVERY
            await w.flush()
            finished.append(perf())
            written += count
            appends += w.appends

    with trio.fail_after(seconds + 120):
        async with trio.open_nursery() as outer:
            outer.start_soon(poll_acks)
            async with trio.open_nursery() as nursery:
                for k in range(writers):
                    nursery.start_soon(writer, k)
                await all_ready.wait()
                started = perf()
                stop_at = started + seconds
                go.set()
            collect()
            outer.cancel_scope.cancel()
    elapsed = max(finished) - started
    latencies.sort()
    return {
        "events_per_s": written / elapsed,
        "MBps": written * size / elapsed / 1e6,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "events_per_append": written / max(1, appends),
        "samples": len(latencies),
    }


async def run_appends(address: str, inflight: int, seconds: float) -> dict[str, float]:
    """1 MiB appends on one connection with up to ``inflight`` unacknowledged."""
    segment = "bench/appends"
    data = os.urandom(MIB)
    perf = time.perf_counter
    latencies: list[float] = []
    slots = trio.Semaphore(inflight)
    send, receive = trio.open_memory_channel[tuple[ResponseFuture, float]](inflight)

    async def acknowledgements() -> None:
        async with receive:
            async for fut, sent in receive:
                await fut.wait()
                latencies.append(perf() - sent)
                slots.release()

    with trio.fail_after(seconds + 120):
        async with open_client(address) as client:
            await client.create(segment)
            started = perf()
            stop_at = started + seconds
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acknowledgements)
                async with send:
                    while True:
                        await slots.acquire()
                        now = perf()
                        if now >= stop_at:
                            break
                        await send.send((await client.start_append(segment, data), now))
            elapsed = perf() - started
    latencies.sort()
    return {
        "appends_per_s": len(latencies) / elapsed,
        "MBps": len(latencies) * MIB / elapsed / 1e6,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
    }


# -- the report ---------------------------------------------------------------------


def _size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    fio = result["baseline"]["fio_1MiB_fdatasync"]
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, daemon defaults over loopback TCP, "
        f"median of {result['repeat']} runs of {result['seconds']} s each; "
        f"software {result['version']}.",
        "",
        f"Baseline, same directory, same run: fio sequential 1 MiB writes + fdatasync: "
        f"{fio['MBps']:.0f} MB/s.",
        "",
        "Events (`SegmentWriter`, `lines` codec, default writer settings):",
        "",
        "| event size | writers → segments | events/s | MB/s | events per append "
        "| p50 ack ms | p99 ack ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["events"]:
        layout = f"{row['writers']} → {row['segments']}"
        if row["writers"] > 1 and row["segments"] == 1:
            layout += " (shared)"
        lines.append(
            f"| {_size_label(row['size'])} | {layout} | {row['events_per_s']:,.0f} "
            f"| {row['MBps']:.1f} | {row['events_per_append']:,.0f} "
            f"| {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    lines += [
        "",
        "1 MiB appends (`Client.start_append`, one connection):",
        "",
        "| in flight | appends/s | MB/s | × fio 1 MiB | p50 ack ms | p99 ack ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["appends_1MiB"]:
        lines.append(
            f"| {row['inflight']} | {row['appends_per_s']:,.0f} | {row['MBps']:.0f} "
            f"| {row['vs_fio']:.2f}× | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    ev, mib = result["targets"]["events_100B_1x1"], result["targets"]["appends_1MiB"]
    lines += [
        "",
        f"Targets: {ev['target']} — {ev['events_per_s']:,.0f}/s, p99 {ev['p99_ms']:.1f} ms "
        f"({met(ev['met'])}); {mib['target']} — best "
        f"{mib['best_vs_fio']:.2f}× ({mib['best_inflight']} in flight) "
        f"({met(mib['met'])}).",
        TABLE_END,
    ]
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where daemons and fio write (default: .bench-tmp in the repo)",
        quick_help="smoke test: 1 run of 1 s",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per case (default 3)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeat = 1.0, 1
    stop_on_signals()
    fio = ensure_fio()
    fio_runs: list[dict[str, float]] = []
    events: dict[tuple[int, int, int], list[dict[str, float]]] = {}
    appends: dict[int, list[dict[str, float]]] = {}
    with work_directory(args.dir, "ingest-") as root:
        for rep in range(args.repeat):
            # Interleave baseline and subject so both see the same noise.
            fio_runs.append(run_fio(fio, root, "1M", "512M"))
            log(f"rep {rep} fio 1M: {fio_runs[-1]}")
            for size in EVENT_SIZES:
                for writers, segments in WRITER_LAYOUTS:
                    r = measure(root, "events", run_events, size, writers, segments, args.seconds)
                    events.setdefault((size, writers, segments), []).append(r)
                    log(f"rep {rep} {size} B {writers}->{segments}: {r}")
            for inflight in INFLIGHT:
                r = measure(root, "appends", run_appends, inflight, args.seconds)
                appends.setdefault(inflight, []).append(r)
                log(f"rep {rep} 1 MiB x{inflight} in flight: {r}")
    base = {"fio_1MiB_fdatasync": median_of(fio_runs)}
    fio_mbps = base["fio_1MiB_fdatasync"]["MBps"]
    event_rows = [
        {"size": size, "writers": w, "segments": s, **median_of(runs)}
        for (size, w, s), runs in events.items()
    ]
    append_rows = [
        {"inflight": n, **(m := median_of(runs)), "vs_fio": m["MBps"] / fio_mbps}
        for n, runs in appends.items()
    ]
    small = next(r for r in event_rows if (r["size"], r["writers"], r["segments"]) == (100, 1, 1))
    best = max(append_rows, key=lambda r: r["MBps"])
    targets = {
        "events_100B_1x1": {
            "target": f"100 B events, 1 writer → 1 segment ≥ {TARGET_EVENTS:,} events/s "
            f"with p99 ack ≤ {TARGET_EVENTS_P99_MS:.0f} ms",
            "events_per_s": small["events_per_s"],
            "p99_ms": small["p99_ms"],
            "met": small["events_per_s"] >= TARGET_EVENTS
            and small["p99_ms"] <= TARGET_EVENTS_P99_MS,
        },
        "appends_1MiB": {
            "target": f"1 MiB appends ≥ {TARGET_MIB_VS_FIO}× fio's 1 MiB fdatasync bandwidth",
            "best_vs_fio": best["vs_fio"],
            "best_inflight": best["inflight"],
            "met": best["vs_fio"] >= TARGET_MIB_VS_FIO,
        },
    }
    result = {
        **result_header("ingest"),
        "seconds": args.seconds,
        "repeat": args.repeat,
        "baseline": base,
        "events": event_rows,
        "appends_1MiB": append_rows,
        "targets": targets,
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
