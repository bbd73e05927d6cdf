#!/usr/bin/env python3
"""FUSE read benchmark: the mount against s3fs-fuse, rclone, boto3 and a local file.

One embedded S3 server (SeaweedFS, `gateway.embedded.EmbeddedS3`) runs
for the whole benchmark. A real daemon (its own process, `[tier2]` pointing
at that server, segments mounted) gets one segment of --size bytes (default
1 GiB; 1 MiB appends of seeded random bytes), which is sealed and flushed:
chunk objects of up to 64 MiB (flush_size = max_chunk_size = 64 MiB; about
16 for 1 GiB), nothing left that Tier 2 does not hold. The same bytes are
also written to a local file. Then, every round:

* **ours**: ``dd if=<mount>/bench/seg of=/dev/null bs=1M`` in three states:
  *cold* (daemon stopped, its cache directory deleted, restarted; page cache
  dropped), *warm* (the same file again: sealed segments keep their pages),
  *RocksDB warm* (every 1 MiB block read once over the protocol in a random
  order, so that each is a direct read and goes into the cache store; daemon
  restarted so its memory holds nothing; page cache dropped). A fourth, not
  a target: RocksDB warm with RocksDB's files still in the page cache (the
  daemon restarted again right after the RocksDB-warm read; the new mount
  has no pages of its own). SeaweedFS's written bytes are counted during
  each dd: the cold read must fetch the segment, the RocksDB-warm ones must
  not.
* **s3fs-fuse** (Debian `s3fs`, defaults: no disk cache) and **rclone
  mount** (Debian `rclone`, ``--vfs-cache-mode off`` and ``full``, a fresh
  cache each time) mounting the same bucket: dd of the segment's chunk
  objects one after another, in key order (their concatenation is the
  segment). Each mount is fresh and the page cache dropped.
* **boto3**: one GET per chunk object, sequentially (``Body.read()``), and
  8 threads doing 8 MiB ranged GETs over the chunk objects.
* **local file**: dd with the page cache dropped, then again from it.
* **C FUSE** (the kernel's limit for a FUSE daemon that serves reads
  itself): libfuse's ``passthrough_ll`` example, built from this machine's
  libfuse3-dev, mounted with ``cache=always`` over the local file's
  directory; dd with the page cache dropped, then again from it (read
  alternately with the local file, as ours is).

* **first read** (FUSE passthrough's cost to the read that makes a segment
  file): the cache and segment files wiped, the page cache dropped, one dd
  with ``[fuse] passthrough`` on and one with it off, in the same round
  (order alternating); their ratio per round, the median of the rounds.
  Then, with it on, once the segment file is made (the daemon has served
  all of the segment), a second dd with the page cache dropped and the bytes
  the daemon wrote meanwhile (its replies to reads; ~0 through passthrough).
  Before that, in a fresh daemon with the cache wiped, a 4 KiB read of the
  segment (``head -c 4096``) and the bytes SeaweedFS sent in the 5 s after
  it, on and off: a segment file made at that point would show as a download
  of the whole segment.

Also, from a cold state (page cache dropped, fresh mounts, our cache
wiped): first-byte latency (``open`` + ``pread`` of 4 KiB at an offset no
one read before, then ``close``; a 4 KiB ranged GET for boto3) and 4 KiB
random-read IOPS (4 threads; each read in a different 1 MiB block, at most
10 s). Offsets come from a seeded RNG and are the same for every system in
a round. The page cache is dropped before every cold measurement, which
drops SeaweedFS's files too: every system reads from the same server and
disk. The systems' order rotates from round to round.

Reads from S3 or a cold disk are timed by the wall clock around the dd
processes (opens included); page-cache reads (a GiB in ~0.1 s) by dd's own
clock, median of 3 dd runs.

* **active** (the page cache across opens of a segment still being
  written): two segments of --active-size bytes (default 256 MiB; 1 MiB
  appends), one left active, one sealed, written in the same daemon. With
  the page cache dropped, each is read 5 times with dd, a new open each
  time, alternately (each first in turn); the re-reads' MB/s (dd's own clock) of the active one
  against the sealed one's, and the bytes the daemon wrote meanwhile (its
  replies to the kernel's reads go through ``write``: ``wchar``), which a
  re-read from the page cache leaves at ~0. Then 1 MiB is appended to the
  active one and, once ``stat`` shows it, the file read once more: what
  growth costs (the kernel drops the file's pages when it sees a new size).

Every sequential read is checked: a CRC32C of the bytes read back through
each mount (right after its timed dd) against the expected one; every
4 KiB read is compared with the expected bytes.

Targets (issue 34, "reads at the kernel's limit"): cold ≥ 1.5 times s3fs-fuse
and ≥ 0.9 times one boto3 GET per chunk object; page-cache warm ≥ 0.9 times
the local file from the page cache; RocksDB warm (the page cache dropped)
≥ 0.9 times the C FUSE mount reading its local file with the page cache
dropped. Also reported: cold against rclone (cache off), RocksDB warm in MB/s.

Prints one JSON document (progress on stderr); with --write-table also
rewrites the FUSE section of docs/PERFORMANCE.md. Needs root (drop_caches,
mounts, apt-get). --quick: 1 round, a 256 MiB segment. --parts runs only
some systems (e.g. ``--parts ours,boto3,active``; default: all); the table
is written only for a full run.

This file drives the rounds; the systems under test are in
fuse_read_systems.py, the measuring tools in fuse_read_measure.py, the
targets and the table in fuse_read_report.py.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import argument_parser, print_result, result_header, stop_on_signals  # noqa: E402
from fuse_read_measure import (  # noqa: E402
    IOPS_READS,
    IOPS_THREADS,
    LATENCY_SAMPLES,
    GiB,
    MiB,
    random_offsets,
)
from fuse_read_report import peer_versions, source_version, targets, write_table  # noqa: E402
from fuse_read_systems import (  # noqa: E402
    PARTS,
    RANDOM_SYSTEMS,
    SEQ_MODES,
    Bench,
    run_first_read,
    run_passthrough,
)

# -- driving the rounds ---------------------------------------------------------------------


def run(
    bench: Bench, repeat: int, parts: tuple[str, ...] = PARTS, active_size: int = 256 * MiB
) -> dict[str, Any]:
    seq: dict[str, list[dict[str, float]]] = {}
    active: list[dict[str, Any]] = []
    first: dict[str, list[float]] = {}
    iops: dict[str, list[dict[str, float]]] = {}
    warming: list[dict[str, float]] = []
    ratios: dict[str, list[float]] = {}
    partial: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(repeat):
        latency, iops_offsets = random_offsets(bench.size, rnd)
        rclone_off = functools.partial(bench.rclone_mount, "off")
        rclone_full = functools.partial(bench.rclone_mount, "full")
        systems: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("ours", functools.partial(bench.run_ours, rnd, latency, iops_offsets)),
            (
                "s3fs",
                functools.partial(
                    bench.run_peer, "s3fs", bench.s3fs_mount, rnd, latency, iops_offsets
                ),
            ),
            (
                "rclone_off",
                functools.partial(
                    bench.run_peer, "rclone_off", rclone_off, rnd, latency, iops_offsets
                ),
            ),
            (
                "rclone_full",
                functools.partial(bench.run_peer, "rclone_full", rclone_full, rnd, None, None),
            ),
            ("boto3", functools.partial(bench.run_boto3, rnd, latency, iops_offsets)),
            ("local", functools.partial(bench.run_local, rnd, latency, iops_offsets)),
            ("cfuse", functools.partial(bench.run_cfuse, rnd)),
            ("passthrough", functools.partial(run_passthrough, bench, rnd)),
            ("first_read", functools.partial(run_first_read, bench, rnd)),
            ("active", functools.partial(bench.run_active, rnd, active_size)),
        ]
        systems = [(name, fn) for name, fn in systems if name in parts]
        # Rotate the order, so that no system always runs first or after another.
        k = rnd % len(systems)
        for name, fn in systems[k:] + systems[:k]:
            out = fn()
            for mode in SEQ_MODES:
                if mode in out:
                    seq.setdefault(mode, []).append(out[mode])
            if "first_byte_ms" in out:
                first.setdefault(name, []).extend(out["first_byte_ms"])
                iops.setdefault(name, []).append(out["iops"])
            if "warming" in out:
                warming.append(out["warming"])
            for key, value in out.get("ratios", {}).items():
                ratios.setdefault(key, []).append(value)
            for key in ("partial_on", "partial_off"):
                if key in out:
                    partial.setdefault(key, []).append(out[key])
            if name == "active":
                active.append(out)
    sequential: dict[str, dict[str, Any]] = {}
    for mode, runs in seq.items():
        sequential[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        sequential[mode]["runs"] = [r["MBps"] for r in runs]
    random_reads = {
        name: {
            "first_byte_p50_ms": statistics.median(first[name]),
            "first_byte_max_ms": max(first[name]),
            "first_byte_samples": len(first[name]),
            "iops": statistics.median(r["iops"] for r in iops[name]),
            "iops_runs": [r["iops"] for r in iops[name]],
            "reads_per_run": [r["reads"] for r in iops[name]],
        }
        for name in RANDOM_SYSTEMS
        if name in first
    }
    result = {"sequential": sequential, "random_4k": random_reads, "warming": warming}
    # Paired within a round (same load): the median of the rounds' ratios.
    result["ratios"] = {k: {"median": statistics.median(v), "runs": v} for k, v in ratios.items()}
    if partial:
        result["partial_4k"] = partial
    if active:
        result["active_segment"] = {
            "size": active_size,
            "reread_vs_sealed": statistics.median(r["ratio"] for r in active),
            "ratio_runs": [r["ratio"] for r in active],
            "rounds": active,
        }
    return result


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir=pathlib.Path("/var/tmp"),
        work_dir_help="where the work directory (S3 data, cache, mounts) is made "
        "(default /var/tmp)",
        repeat_help="rounds (default 3)",
        quick_help="smoke test: 1 round, 256 MiB",
    )
    parser.add_argument("--size", type=int, default=1 * GiB, help="segment bytes (default 1 GiB)")
    parser.add_argument(
        "--parts", default=",".join(PARTS),
        help=f"comma-separated systems to run (default all: {','.join(PARTS)})",
    )  # fmt: skip
    parser.add_argument(
        "--active-size", type=int, default=256 * MiB,
        help="bytes of each segment of the active-segment case (default 256 MiB)",
    )  # fmt: skip
    args = parser.parse_args()
    parts = tuple(p for p in args.parts.split(",") if p)
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown --parts {unknown}; choose from {','.join(PARTS)}")
    if args.write_table and set(parts) != set(PARTS):
        parser.error("--write-table needs a full run (every part)")
    if args.quick:
        args.repeat, args.size = 1, 256 * MiB
    size = max(args.size // MiB, LATENCY_SAMPLES + 1) * MiB
    if os.geteuid() != 0:
        raise SystemExit("bench/fuse_read.py needs root: it drops the page cache and mounts")
    stop_on_signals()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=args.dir, prefix="fuse-read-"))
    result: dict[str, Any] = {
        **result_header("fuse_read"),
        "source": source_version(),
        "repeat": args.repeat,
        "quick": args.quick,
        "size": size,
        "iops_threads": IOPS_THREADS,
        "iops_reads": IOPS_READS,
        "latency_samples_per_round": LATENCY_SAMPLES,
        "parts": list(parts),
    }
    bench = Bench(work, size)
    try:
        bench.start(
            peers=bool({"s3fs", "rclone_off", "rclone_full"} & set(parts)), cfuse="cfuse" in parts
        )
        result["peers"] = peer_versions(bench)
        bench.build()
        result["chunks"] = len(bench.chunks)
        result["chunk_sizes_MiB"] = [c.length / MiB for c in bench.chunks]
        active_size = min(args.active_size // MiB, size // MiB) * MiB
        result.update(run(bench, args.repeat, parts, active_size))
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = targets(result)
    print_result(result)
    if args.write_table:
        write_table(result, args.write_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
