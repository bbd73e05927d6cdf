#!/usr/bin/env python3
"""Streams and transactions benchmark: rolling ingest and commit latency against a real daemon.

Every daemon is its own process (``segment-gateway serve``, fresh data
directory under --dir, Tier 2 a ``file://`` directory beside it, no mount),
driven from this process over loopback TCP.

- **Ingest into a rolling stream.** 4 `gateway.client.writer.SegmentWriter`s
  (``lines`` codec, default writer settings) write 1 KiB events as fast as
  they can for --seconds, either to one plain segment (the baseline) or to a
  stream whose current segment is sealed and succeeded every 64 MiB (the
  writers address the stream; the daemon routes each append to its current
  segment). Each run has a daemon of its own with the Tier 2 defaults
  (flush_size 8 MiB, flush_interval 10 s), so both cases flush as they go and
  the stream's extra work is the rolling. The clock stops when everything
  written is acknowledged; the bytes in the segment(s) are then checked
  against what was written. The two cases alternate, the first of each round
  alternating too. Target: stream >= 0.95x plain (medians).
- **Transaction commit latency.** In one daemon per round (flushing by policy
  off, so that "not flushed" means it; every flush is asked for), for 1 KiB,
  1 MiB and 64 MiB of random bytes (the largest append is 8 MiB, so 64 MiB is
  8 appends of 8 MiB): a plain append of the bytes to a segment (the
  baseline), and a transaction on another segment — begin, append the bytes,
  then the timed commit — either straight away ("not flushed") or after
  flushing the transaction to Tier 2 ("flushed"). The three cases rotate
  sample by sample; before each, everything is flushed so that no Tier-2
  work of the previous one overlaps it. A commit journals two small records
  (seal and merge) whatever the transaction's size, so its latency should
  not grow with it. Also reported: begin → commit done for the unflushed
  case (the appends included) against the plain append.

Prints one JSON document (progress on stderr): medians, and ratios to the
baseline measured in the same run. With --write-table also rewrites the
"Streams and transactions" section of docs/PERFORMANCE.md (adding it if it is
missing). --quick (1 round, 1 s ingest runs, a 16 MiB roll size so that
rolls happen, no 64 MiB transactions) checks that it works end to end.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
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
    median_of,
    met,
    print_result,
    replace_table,
    result_header,
    running_daemon,
    stop_on_signals,
    work_directory,
)

from gateway.client.client import open_client  # noqa: E402
from gateway.client.writer import SegmentWriter, open_segment_writer  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
MAX_APPEND = 8 * MIB
DAEMON_CONFIG = '[container]\nmax_append_bytes = "8 MiB"\n'
#: Tier 2 defaults (flush_size 8 MiB, flush_interval 10 s, 64 MiB chunks), on disk.
TIER2_DEFAULTS = '[tier2]\nurl = "file://{root}/tier2"\n'

WRITERS = 4
EVENT_SIZE = 1 * KIB
ROLL_SIZE = 64 * MIB
QUICK_ROLL_SIZE = 16 * MIB
WRITE_BLOCK = 256  # events written between two looks at the clock
STREAM = "s"
PLAIN = "bench/plain"
TARGET_INGEST = 0.95

TXN_SIZES = [1 * KIB, 1 * MIB, 64 * MIB]
QUICK_TXN_SIZES = [1 * KIB, 1 * MIB]
#: Samples of each case per size and round.
TXN_SAMPLES = {1 * KIB: 20, 1 * MIB: 10, 64 * MIB: 5}
QUICK_TXN_SAMPLES = {1 * KIB: 5, 1 * MIB: 3}
TXN_PARENT = "bench/parent"
TXN_BASELINE = "bench/plain-append"
TXN_CASES = ("append", "commit_unflushed", "commit_flushed")

TABLE_START = "<!-- bench/streams.py:start -->"
TABLE_END = "<!-- bench/streams.py:end -->"
SECTION_HEADING = "## Streams and transactions: `bench/streams.py`"
SECTION_INTRO = """\
Writers in one client process drive a real daemon (its own process, a fresh
data directory each run, Tier 2 a local directory, no mount) over loopback
TCP.

- **Ingest into a rolling stream**: 4 `SegmentWriter`s (`lines` codec)
  write 1 KiB events as fast as they can for a few seconds into a stream
  that rolls (seals its current segment and starts the next) every 64 MiB,
  against the same writers into one plain segment. Tier 2 defaults in both
  (flush every 8 MiB), so what differs is the rolling and the routing of
  appends to the stream's current segment. The clock stops when every event
  is acknowledged; the segments' lengths are checked against what was
  written. The two cases alternate, each run with a daemon of its own.
  Target: stream ≥ 0.95× plain.
- **Transaction commit latency**: for 1 KiB, 1 MiB and 64 MiB, the time of
  `commit_transaction` after the bytes were appended to the transaction
  (not flushed) or appended and flushed to Tier 2 (flushed), against one
  plain append of the same bytes to a segment (64 MiB: 8 appends of 8 MiB,
  the largest append; the transaction gets its bytes the same way). A
  commit journals two small records (seal and merge), whatever the size.
  One daemon per round with flushing by policy off; the three cases rotate
  sample by sample, and everything is flushed before each sample so that
  background Tier-2 work does not overlap it."""


# -- daemons ------------------------------------------------------------------------


def measure(
    root: pathlib.Path,
    label: str,
    config: str,
    fn: Callable[..., Awaitable[dict[str, Any]]],
    *args: Any,
) -> dict[str, Any]:
    """``trio.run(fn, address, *args)`` against a daemon of its own, then clean up."""
    work = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=f"{label}-"))
    try:
        with running_daemon(work, DAEMON_CONFIG + config.format(root=work)) as address:
            return trio.run(fn, address, *args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- ingest: a rolling stream against a plain segment --------------------------------


async def run_ingest(address: str, stream: bool, roll_size: int, seconds: float) -> dict[str, Any]:
    """WRITERS writers of EVENT_SIZE events into a stream (rolling) or a plain segment."""
    async with open_client(address) as client:
        if stream:
            await client.create_stream(STREAM, {"roll_size": roll_size})
        else:
            await client.create(PLAIN)
    target = STREAM if stream else PLAIN
    event = (b"0123456789abcdef" * (EVENT_SIZE // 16 + 1))[:EVENT_SIZE]
    perf = time.perf_counter
    ready: list[SegmentWriter] = []
    all_ready, go = trio.Event(), trio.Event()
    stop_at = 0.0
    written = appends = 0
    finished: list[float] = []

    async def writer() -> None:
        nonlocal written, appends
        async with open_segment_writer(address, target, codec="lines") as w:
            ready.append(w)
            if len(ready) == WRITERS:
                all_ready.set()
            await go.wait()
            write = w.write
            count = 0
            while perf() < stop_at:
                for _ in range(WRITE_BLOCK):
                    await write(event)
                count += WRITE_BLOCK
            await w.flush()
            finished.append(perf())
            written += count
            appends += w.appends

    with trio.fail_after(seconds + 120):
        async with trio.open_nursery() as nursery:
            for _ in range(WRITERS):
                nursery.start_soon(writer)
            await all_ready.wait()
            started = perf()
            stop_at = started + seconds
            go.set()
        elapsed = max(finished) - started
        async with open_client(address) as client:
            if stream:
                lengths = [s.length for s in (await client.stream(STREAM)).segments]
            else:
                lengths = [(await client.info(PLAIN)).length]
    stored, expected = sum(lengths), written * (EVENT_SIZE + 1)  # lines: event + "\n"
    if stored != expected:
        raise RuntimeError(
            f"{target!r} holds {stored} bytes in {len(lengths)} segment(s); "
            f"{written} acknowledged events of {EVENT_SIZE} B + newline are {expected}"
        )
    return {
        "MBps": written * EVENT_SIZE / elapsed / 1e6,
        "events_per_s": written / elapsed,
        "events_per_append": written / max(1, appends),
        "segments": len(lengths),
        "GB_written": stored / 1e9,
    }


# -- transactions: commit latency against a plain append -----------------------------


async def run_transactions(
    address: str, sizes: list[int], samples: dict[int, int], round_no: int
) -> dict[str, Any]:
    """Seconds per case and size: plain append, commit (not flushed / flushed), begin→commit."""
    perf = time.perf_counter
    out: dict[int, dict[str, list[float]]] = {
        size: {c: [] for c in (*TXN_CASES, "begin_to_commit_unflushed")} for size in sizes
    }
    with trio.fail_after(600):
        async with open_client(address) as client:
            await client.create(TXN_PARENT)
            await client.create(TXN_BASELINE)
            parent_length = 0

            async def put(name: str, data: bytes, pieces: int) -> None:
                for _ in range(pieces):
                    await client.append(name, data)

            async def transaction(data: bytes, pieces: int, flushed: bool) -> None:
                nonlocal parent_length
                size = len(data) * pieces
                began = perf()
                info = await client.begin_transaction(TXN_PARENT)
                await put(info.name, data, pieces)
                if flushed:
                    await client.flush(info.name)
                committing = perf()
                done = await client.commit_transaction(info.name)
                now = perf()
                if (done.segment, done.offset, done.length) != (TXN_PARENT, parent_length, size):
                    raise RuntimeError(
                        f"commit of {info.name} ({size} B) landed at {done.segment!r} "
                        f"{done.offset}+{done.length}; expected {TXN_PARENT!r} {parent_length}"
                    )
                parent_length += size
                case = "commit_flushed" if flushed else "commit_unflushed"
                out[size][case].append(now - committing)
                if not flushed:
                    out[size]["begin_to_commit_unflushed"].append(now - began)

            for size in sizes:
                piece = min(size, MAX_APPEND)
                pieces = size // piece
                data = os.urandom(piece)
                for k in range(samples[size]):
                    # Rotate the order so no case always follows the same one.
                    shift = (k + round_no) % len(TXN_CASES)
                    for case in TXN_CASES[shift:] + TXN_CASES[:shift]:
                        await client.flush()  # no Tier-2 work of the last sample overlaps
                        if case == "append":
                            started = perf()
                            await put(TXN_BASELINE, data, pieces)
                            out[size]["append"].append(perf() - started)
                        else:
                            await transaction(data, pieces, flushed=case == "commit_flushed")
            await client.flush()
            parent = await client.info(TXN_PARENT)
            if parent.length != parent_length:
                raise RuntimeError(f"{TXN_PARENT} is {parent.length} B, expected {parent_length}")
    return {"seconds": {str(size): cases for size, cases in out.items()}}


# -- the report ---------------------------------------------------------------------


def _size_label(size: int) -> str:
    if size >= MIB:
        return f"{size // MIB} MiB"
    return f"{size // KIB} KiB" if size >= KIB else f"{size} B"


def _range(min_max: list[float]) -> str:
    return f"{min_max[0]:.1f}–{min_max[1]:.1f}"


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    """Rewrite the section's table in ``path`` (add the section at the end if it is missing)."""
    ing = result["ingest"]
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, daemon over loopback TCP; "
        f"software {result['version']}.",
        "",
        f"Ingest, {ing['writers']} writers × {_size_label(ing['event_size'])} events (`lines`), "
        f"medians of {ing['rounds']} rounds, each a {ing['seconds']:g} s run of both "
        f"(which goes first alternates; a fresh daemon per run):",
        "",
        "| into | MB/s | events/s | events per append | segments at the end | × plain |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (
        ("plain", "one plain segment"),
        ("stream", f"a stream rolling every {_mib(ing['roll_size'])}"),
    ):
        row = ing[key]
        ratio = "1.00× (baseline)" if key == "plain" else f"**{ing['ratio']:.2f}×**"
        lines.append(
            f"| {label} | {row['MBps']:.1f} | {row['events_per_s']:,.0f} "
            f"| {row['events_per_append']:,.0f} | {row['segments']:g} | {ratio} |"
        )
    rounds = ", ".join(f"{r:.2f}" for r in ing["round_ratios"])
    lines += [
        "",
        f"Stream ÷ plain in each round (the round's two runs, back to back): {rounds}.",
        "",
        f"Transactions: commit latency against one plain append of the same bytes, "
        f"median (min–max) over the samples of {result['transactions']['rounds']} rounds "
        f"(one daemon per round, flushing by policy off):",
        "",
        "| size | samples | plain append ms | commit, not flushed ms | × append "
        "| commit, flushed ms | × append | begin → commit done, not flushed ms | × append |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["transactions"]["rows"]:
        lines.append(
            f"| {_size_label(row['size'])} | {row['samples']} | {row['append_ms']:.2f} "
            f"| {row['commit_unflushed_ms']:.2f} ({_range(row['commit_unflushed_ms_min_max'])}) "
            f"| **{row['commit_unflushed_vs_append']:.2f}×** "
            f"| {row['commit_flushed_ms']:.2f} ({_range(row['commit_flushed_ms_min_max'])}) "
            f"| **{row['commit_flushed_vs_append']:.2f}×** "
            f"| {row['begin_to_commit_unflushed_ms']:.2f} "
            f"| {row['begin_to_commit_unflushed_vs_append']:.2f}× |"
        )
    target = result["targets"]["stream_ingest"]
    lines += [
        "",
        f"Target: {target['target']} — {target['ratio']:.2f}× ({met(target['met'])}).",
        TABLE_END,
    ]
    text = path.read_text()
    if TABLE_START not in text:
        path.write_text(
            text.rstrip("\n") + f"\n\n{SECTION_HEADING}\n\n{SECTION_INTRO}\n\n"
            f"{TABLE_START}\n{TABLE_END}\n"
        )
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where daemons write (default: .bench-tmp in the repo)",
        repeat=7,
        repeat_help="ingest rounds (plain and stream each; default 7)",
        quick_help="smoke test: 1 round of 1 s",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per ingest run (default 5)")
    parser.add_argument(
        "--txn-rounds", type=int, default=3,
        help="transaction rounds, one daemon each (default 3)",
    )  # fmt: skip
    args = parser.parse_args()
    roll_size, sizes, samples = ROLL_SIZE, TXN_SIZES, TXN_SAMPLES
    if args.quick:
        args.seconds, args.repeat, args.txn_rounds = 1.0, 1, 1
        roll_size, sizes, samples = QUICK_ROLL_SIZE, QUICK_TXN_SIZES, QUICK_TXN_SAMPLES
    stop_on_signals()
    ingest: dict[str, list[dict[str, Any]]] = {"plain": [], "stream": []}
    txn_rounds: list[dict[str, Any]] = []
    began = time.monotonic()
    with work_directory(args.dir, "streams-") as root:
        for rep in range(args.repeat):
            # Alternate which case goes first, so both see the same drift.
            order = ("plain", "stream") if rep % 2 == 0 else ("stream", "plain")
            for case in order:
                r = measure(
                    root, case, TIER2_DEFAULTS, run_ingest, case == "stream", roll_size,
                    args.seconds,
                )  # fmt: skip
                ingest[case].append(r)
                log(f"ingest round {rep} {case}: {r}")
        for rep in range(args.txn_rounds):
            r = measure(root, "txn", TIER2_OFF, run_transactions, sizes, samples, rep)
            txn_rounds.append(r)
            brief = {
                size: {c: f"{statistics.median(v) * 1e3:.2f} ms" for c, v in cases.items()}
                for size, cases in r["seconds"].items()
            }
            log(f"transactions round {rep}: {brief}")
    log(f"done in {time.monotonic() - began:.0f} s")

    plain, stream = median_of(ingest["plain"]), median_of(ingest["stream"])
    ratio = stream["MBps"] / plain["MBps"]
    pairs = zip(ingest["plain"], ingest["stream"], strict=True)
    round_ratios = [s["MBps"] / p["MBps"] for p, s in pairs]
    rows = []
    for size in sizes:
        pooled = {
            case: [x for r in txn_rounds for x in r["seconds"][str(size)][case]]
            for case in (*TXN_CASES, "begin_to_commit_unflushed")
        }
        ms = {case: statistics.median(v) * 1e3 for case, v in pooled.items()}
        rows.append(
            {
                "size": size,
                "samples": len(pooled["append"]),
                "append_ms": ms["append"],
                "commit_unflushed_ms": ms["commit_unflushed"],
                "commit_unflushed_vs_append": ms["commit_unflushed"] / ms["append"],
                "commit_flushed_ms": ms["commit_flushed"],
                "commit_flushed_vs_append": ms["commit_flushed"] / ms["append"],
                "begin_to_commit_unflushed_ms": ms["begin_to_commit_unflushed"],
                "begin_to_commit_unflushed_vs_append": ms["begin_to_commit_unflushed"]
                / ms["append"],
                "commit_unflushed_ms_min_max": [
                    min(pooled["commit_unflushed"]) * 1e3,
                    max(pooled["commit_unflushed"]) * 1e3,
                ],
                "commit_flushed_ms_min_max": [
                    min(pooled["commit_flushed"]) * 1e3,
                    max(pooled["commit_flushed"]) * 1e3,
                ],
            }
        )
    result = {
        **result_header("streams"),
        "quick": args.quick,
        "ingest": {
            "writers": WRITERS,
            "event_size": EVENT_SIZE,
            "roll_size": roll_size,
            "seconds": args.seconds,
            "rounds": args.repeat,
            "plain": plain,
            "stream": stream,
            "ratio": ratio,
            "round_ratios": round_ratios,
        },
        "transactions": {"rounds": args.txn_rounds, "rows": rows},
        "targets": {
            "stream_ingest": {
                "target": f"ingest into a stream rolling every {_mib(roll_size)} "
                f"≥ {TARGET_INGEST}× one plain segment",
                "ratio": ratio,
                "met": ratio >= TARGET_INGEST,
            },
        },
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
