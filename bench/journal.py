#!/usr/bin/env python3
"""Journal benchmark: group-committed appends against fio on the same directory.

For operation sizes 100 B, 1 KiB, 64 KiB and 1 MiB and 1, 16 and 256
concurrent appenders (trio tasks in this process, each awaiting its append
before sending the next), it measures appends/s, MB/s and ack latency
p50/p99. The baseline, measured in the same run on the same directory, is
fio doing sequential writes with an fdatasync after each write, at 4 KiB and
1 MiB. Each measurement is repeated and the median reported, because the
machines are shared and noisy.

Prints one JSON document; with --write-table also rewrites the journal table
in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    argument_parser,
    ensure_fio,
    median_of,
    met,
    print_result,
    replace_table,
    result_header,
    run_fio,
)

from gateway.config import JournalConfig  # noqa: E402
from gateway.journal import open_journal  # noqa: E402
from gateway.journal.format import encode_append  # noqa: E402

SIZES = [100, 1024, 64 * 1024, 1024 * 1024]
CONCURRENCY = [1, 16, 256]
TABLE_START = "<!-- bench/journal.py:start -->"
TABLE_END = "<!-- bench/journal.py:end -->"


async def run_journal(
    directory: pathlib.Path, size: int, concurrency: int, seconds: float
) -> dict[str, float]:
    """Closed-loop appenders for ``seconds``; throughput and ack latency."""
    shutil.rmtree(directory, ignore_errors=True)
    data = os.urandom(size)
    latencies: list[float] = []
    count = 0
    async with open_journal(directory, JournalConfig()) as journal:
        stop_at = time.perf_counter() + seconds

        async def appender(k: int) -> None:
            nonlocal count
            i = 0
            perf = time.perf_counter
            while True:
                started = perf()
                if started >= stop_at:
                    return
                await journal.append_parts(encode_append(k + 1, i, data))
                latencies.append(perf() - started)
                i += size
                count += 1

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(concurrency):
                nursery.start_soon(appender, k)
        elapsed = time.perf_counter() - started
        stats = journal.statistics()
    shutil.rmtree(directory, ignore_errors=True)
    latencies.sort()
    return {
        "appends_per_s": count / elapsed,
        "MBps": count * size / elapsed / 1e6,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "ops_per_fdatasync": stats.operations / max(1, stats.groups),
    }


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    fio4k = result["baseline"]["fio_4KiB_fdatasync"]
    fio1m = result["baseline"]["fio_1MiB_fdatasync"]
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, journal defaults, median of "
        f"{result['repeat']} runs of {result['seconds']} s each; software {result['version']}.",
        "",
        f"Baseline, same directory, same run: fio sequential writes + fdatasync: "
        f"4 KiB {fio4k['iops']:,.0f} IOPS ({fio4k['MBps']:.1f} MB/s); "
        f"1 MiB {fio1m['MBps']:.0f} MB/s.",
        "",
        "| op size | appenders | appends/s | MB/s | × fio same size | p50 ack ms | p99 ack ms "
        "| ops per fdatasync |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["journal"]:
        size = row["size"]
        if size >= 1024 * 1024:
            vs = row["MBps"] / fio1m["MBps"]
            vs_text = f"{vs:.2f}× (1 MiB MB/s)"
        elif size <= 4096:
            vs = row["appends_per_s"] / fio4k["iops"]
            vs_text = f"{vs:.1f}× (4 KiB IOPS)"
        else:
            vs_text = "-"
        label = (
            f"{size // 1024} KiB"
            if size >= 1024 and size < 1024 * 1024
            else ("1 MiB" if size == 1024 * 1024 else f"{size} B")
        )
        lines.append(
            f"| {label} | {row['concurrency']} | {row['appends_per_s']:,.0f} | {row['MBps']:.1f} "
            f"| {vs_text} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['ops_per_fdatasync']:.1f} |"
        )
    t = result["targets"]
    lines += [
        "",
        f"Targets: 1 MiB operations ≥ 0.8× fio's 1 MiB bandwidth — best "
        f"{t['1MiB_best_vs_fio']:.2f}×, single appender {t['1MiB_single_vs_fio']:.2f}× "
        f"({met(t['1MiB_met'])}); "
        f"100 B × 256 appenders ≥ 60,000 appends/s with p99 < 10 ms — "
        f"{t['100B_256_appends_per_s']:,.0f}/s, p99 {t['100B_256_p99_ms']:.2f} ms "
        f"({met(t['100B_met'])}).",
        TABLE_END,
    ]
    replace_table(path, TABLE_START, TABLE_END, lines)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    fio = ensure_fio()
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        fio_4k: list[dict[str, float]] = []
        fio_1m: list[dict[str, float]] = []
        rows: dict[tuple[int, int], list[dict[str, float]]] = {}
        for rep in range(args.repeat):
            # Interleave baseline and subject so both see the same noise.
            fio_4k.append(run_fio(fio, args.dir, "4k", "32M"))
            fio_1m.append(run_fio(fio, args.dir, "1M", "512M"))
            for size in SIZES:
                for conc in CONCURRENCY:
                    r = trio.run(run_journal, args.dir / "journal", size, conc, args.seconds)
                    rows.setdefault((size, conc), []).append(r)
                    print(f"bench: rep {rep} size {size} x{conc}: {r}", file=sys.stderr)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    journal_rows = [
        {"size": size, "concurrency": conc, **median_of(runs)}
        for (size, conc), runs in sorted(rows.items())
    ]
    base = {"fio_4KiB_fdatasync": median_of(fio_4k), "fio_1MiB_fdatasync": median_of(fio_1m)}
    by = {(r["size"], r["concurrency"]): r for r in journal_rows}
    mib = [by[(1024 * 1024, c)]["MBps"] for c in CONCURRENCY]
    small = by[(100, 256)]
    targets = {
        "1MiB_best_vs_fio": max(mib) / base["fio_1MiB_fdatasync"]["MBps"],
        "1MiB_single_vs_fio": mib[0] / base["fio_1MiB_fdatasync"]["MBps"],
        "100B_256_appends_per_s": small["appends_per_s"],
        "100B_256_p99_ms": small["p99_ms"],
    }
    targets["1MiB_met"] = targets["1MiB_best_vs_fio"] >= 0.8
    targets["100B_met"] = small["appends_per_s"] >= 60_000 and small["p99_ms"] < 10
    result = {
        **result_header("journal"),
        "seconds": args.seconds,
        "repeat": args.repeat,
        "baseline": base,
        "journal": journal_rows,
        "targets": targets,
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
