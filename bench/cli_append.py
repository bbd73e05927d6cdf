#!/usr/bin/env python3
"""CLI append benchmark: a new user's first bulk load, through `segment-gateway append`.

Each case starts its own daemon (``segment-gateway serve``, fresh data
directory on the same filesystem as --dir, Tier 2 flushing off so the
figures are the journal's and the cache's) and runs the real command as a
subprocess against it, timing it from start to exit (process start, imports,
``--create`` and the final length query included: what the user waits for):

- ``append --create --raw --file F`` of a 1 GiB file of random bytes;
- ``append --create --file F`` (``lines`` codec) of 1 GiB of 100-byte lines.

After each run the segment is checked: its length is the file's, its event
count (lines) the number of lines, its first and last MiB the file's, and
the command's "appended N event(s), B bytes" line says the same.

Reference, same daemon setup: the same file sent by this process with
`gateway.client.client.Client.start_append` in 4 MiB appends with 16 MiB in flight
(the command's block and window), without the writer or the command: what
one connection of this daemon takes, the command's ceiling.

The baseline, measured in the same run on the same directory, is fio doing
sequential 1 MiB writes with an fdatasync after each, of the same size; fio
runs interleave with the cases on every repeat and medians of the repeats
are reported, because the machines are shared and noisy.

Prints one JSON document (progress on stderr); with --write-table also
rewrites its section of docs/PERFORMANCE.md. --quick (1 run of 64 MiB)
checks that it works end to end.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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

from gateway.cli.append import APPEND_BLOCK, APPEND_WINDOW  # noqa: E402
from gateway.client.client import ResponseFuture, open_client  # noqa: E402

MIB = 1024 * 1024
LINE_BYTES = 100  # with its newline
TABLE_START = "<!-- bench/cli_append.py:start -->"
TABLE_END = "<!-- bench/cli_append.py:end -->"
TARGET_RAW_VS_FIO = 0.7
TARGET_LINES_EVENTS = 1_000_000
#: The command as installed (the console script calls ``gateway.cli.main``);
#: run with ROOT as the working directory, so it is this tree's code.
COMMAND = [sys.executable, "-m", "gateway.cli"]
RUN_TIMEOUT = 900


# -- inputs -----------------------------------------------------------------------


def make_raw(path: pathlib.Path, size: int) -> None:
    """``size`` random bytes (nothing in the path can compress them)."""
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
        f.write(os.urandom(size % MIB))


def make_lines(path: pathlib.Path, size: int) -> int:
    """``size`` // 100 lines of 100 bytes (newline included), all different; their count."""
    count = size // LINE_BYTES
    filler = b"abcdefghijklmnopqrstuvwxyz0123456789" * 3
    with open(path, "wb") as f:
        block: list[bytes] = []
        for i in range(count):
            head = b"%012d " % i
            block.append(head + filler[: LINE_BYTES - 1 - len(head)] + b"\n")
            if len(block) == 10_000:
                f.write(b"".join(block))
                block.clear()
        f.write(b"".join(block))
    return count


# -- the cases --------------------------------------------------------------------


def with_daemon(root: pathlib.Path, name: str, fn: Callable[[str], dict[str, Any]]) -> Any:
    """``fn(address)`` against a daemon of its own, then clean up."""
    work = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=f"{name}-"))
    try:
        with running_daemon(work, TIER2_OFF.format(root=work)) as address:
            return fn(address)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def check_segment(address: str, segment: str, path: pathlib.Path, events: int | None) -> None:
    """The segment holds the file: its length, event count, first and last MiB."""
    size = path.stat().st_size
    async with open_client(address) as client:
        info = await client.info(segment)
        if info.length != size:
            raise SystemExit(f"{segment}: {info.length} bytes, the file has {size}")
        if events is not None and info.event_count != events:
            raise SystemExit(f"{segment}: {info.event_count} events, expected {events}")
        with open(path, "rb") as f:
            for offset in (0, max(0, size - MIB)):
                f.seek(offset)
                want = f.read(MIB)
                got = (await client.read(segment, offset, len(want))).data
                if bytes(got) != want:
                    raise SystemExit(f"{segment}: the bytes at {offset} differ from the file's")


def run_cli(address: str, path: pathlib.Path, lines: int | None) -> dict[str, float]:
    """Time ``segment-gateway append --create [--raw] --file path`` and check what landed."""
    segment = "bench/lines" if lines is not None else "bench/raw"
    mode = [] if lines is not None else ["--raw"]
    command = [*COMMAND, "append", "--connect", address, "--create", *mode,
               "--file", str(path), segment]  # fmt: skip
    started = time.perf_counter()
    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    elapsed = time.perf_counter() - started
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {r.returncode}:\n{r.stderr}")
    size = path.stat().st_size
    m = re.search(r"appended (\d+) event\(s\), (\d+) bytes", r.stderr)
    payload = size - lines if lines is not None else size  # lines: without their newlines
    if m is None or int(m.group(2)) != payload or (lines is not None and int(m.group(1)) != lines):
        raise SystemExit(f"unexpected summary: {r.stderr}")
    trio.run(check_segment, address, segment, path, lines)
    result = {"seconds": elapsed, "MBps": size / elapsed / 1e6}
    if lines is not None:
        result["events_per_s"] = lines / elapsed
    return result


async def run_client(address: str, path: pathlib.Path) -> dict[str, float]:
    """The file in APPEND_BLOCK appends on one connection, APPEND_WINDOW in flight."""
    segment = "bench/client"
    size = path.stat().st_size
    inflight = trio.Semaphore(max(1, APPEND_WINDOW // APPEND_BLOCK))
    send, receive = trio.open_memory_channel[ResponseFuture](float("inf"))

    async def acknowledgements() -> None:
        async with receive:
            async for fut in receive:
                await fut.wait()
                inflight.release()

    async with open_client(address) as client:
        await client.create(segment)
        started = time.perf_counter()
        with open(path, "rb") as f:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acknowledgements)
                async with send:
                    while block := f.read(APPEND_BLOCK):
                        await inflight.acquire()
                        send.send_nowait(await client.start_append(segment, block))
        elapsed = time.perf_counter() - started
    await check_segment(address, segment, path, None)
    return {"seconds": elapsed, "MBps": size / elapsed / 1e6}


# -- the report -------------------------------------------------------------------


def write_table(result: dict[str, Any], path: pathlib.Path) -> None:
    fio = result["baseline"]["fio_1MiB_fdatasync"]["MBps"]
    raw, lines, client = result["raw"], result["lines"], result["client_4MiB"]
    size = result["size_bytes"] / 2**30
    lines_out = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']} (shared with other jobs), daemon "
        f"defaults with Tier 2 flushing off, a fresh daemon per run, median of "
        f"{result['repeat']} runs; software {result['version']}.",
        "",
        f"Baseline, same directory, same run: fio sequential 1 MiB writes + fdatasync of "
        f"{size:g} GiB: {fio:.0f} MB/s.",
        "",
        "| case | seconds | MB/s | × fio | events/s |",
        "|---|---|---|---|---|",
        f"| `append --create --raw --file` {size:g} GiB | {raw['seconds']:.1f} "
        f"| {raw['MBps']:.0f} | {raw['vs_fio']:.2f}× | |",
        f"| `append --create --file` {size:g} GiB of 100 B lines | {lines['seconds']:.1f} "
        f"| {lines['MBps']:.0f} | {lines['vs_fio']:.2f}× | {lines['events_per_s']:,.0f} |",
        f"| reference: `Client.start_append`, {APPEND_BLOCK // MIB} MiB appends, "
        f"{APPEND_WINDOW // MIB} MiB in flight | {client['seconds']:.1f} "
        f"| {client['MBps']:.0f} | {client['vs_fio']:.2f}× | |",
        "",
        f"Targets: {result['targets']['raw']['target']} — {raw['vs_fio']:.2f}× "
        f"({met(result['targets']['raw']['met'])}); "
        f"{result['targets']['lines']['target']} — {lines['events_per_s']:,.0f}/s "
        f"({met(result['targets']['lines']['met'])}).",
        TABLE_END,
    ]
    replace_table(path, TABLE_START, TABLE_END, lines_out)


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where daemons, inputs and fio write (default: .bench-tmp in the repo)",
        quick_help="smoke test: 1 run of 64 MiB",
    )
    parser.add_argument("--size-mib", type=int, default=1024, help="input size (default 1024)")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.repeat = 64, 1
    stop_on_signals()
    fio = ensure_fio()
    size = args.size_mib * MIB
    runs: dict[str, list[dict[str, float]]] = {"fio": [], "raw": [], "lines": [], "client": []}
    with work_directory(args.dir, "cli_append-") as root:
        raw_path, lines_path = root / "input.bin", root / "input.txt"
        make_raw(raw_path, size)
        count = make_lines(lines_path, size)
        for rep in range(args.repeat):
            # Interleave baseline and subjects so all see the same noise.
            runs["fio"].append(run_fio(fio, root, "1M", f"{args.size_mib}M"))
            log(f"rep {rep} fio 1M: {runs['fio'][-1]}")
            cases: list[tuple[str, Callable[[str], dict[str, float]]]] = [
                ("raw", lambda a: run_cli(a, raw_path, None)),
                ("lines", lambda a: run_cli(a, lines_path, count)),
                ("client", lambda a: trio.run(run_client, a, raw_path)),
            ]
            for name, fn in cases:
                runs[name].append(with_daemon(root, name, fn))
                log(f"rep {rep} {name}: {runs[name][-1]}")
    base = median_of(runs["fio"])

    def row(name: str) -> dict[str, float]:
        m = median_of(runs[name])
        # Ratios per run (each to its own rep's fio), then their median.
        ratios = sorted(r["MBps"] / f["MBps"] for r, f in zip(runs[name], runs["fio"], strict=True))
        return {**m, "vs_fio": ratios[len(ratios) // 2]}

    raw, lines, client = row("raw"), row("lines"), row("client")
    result = {
        **result_header("cli_append"),
        "size_bytes": size,
        "repeat": args.repeat,
        "baseline": {"fio_1MiB_fdatasync": base},
        "raw": raw,
        "lines": lines,
        "client_4MiB": client,
        "runs": runs,
        "targets": {
            "raw": {
                "target": f"`append --raw --file` ≥ {TARGET_RAW_VS_FIO}× fio",
                "met": raw["vs_fio"] >= TARGET_RAW_VS_FIO,
            },
            "lines": {
                "target": f"`append` of 100 B lines ≥ {TARGET_LINES_EVENTS:,} events/s",
                "met": lines["events_per_s"] >= TARGET_LINES_EVENTS,
            },
        },
    }
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
