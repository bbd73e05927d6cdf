#!/usr/bin/env python3
"""Reads across nodes: another node's segments against the owner's, and Spark on three nodes.

One SeaweedFS (`gateway.embedded.EmbeddedS3`) and three gateway
daemons sharing one bucket, each with its own mount (tests/helpers/cluster.py).

* **Mount reads.** Node A gets --size MiB (default 1 GiB) of seeded random
  bytes in 8 segments (1 MiB appends), sealed and flushed to Tier 2. Every
  round, in alternating order, the same files are read with ``dd bs=1M``
  through **A's mount** (the owner: local metadata) and through **B's
  mount** (another node: remote metadata, A's chunks read straight from
  Tier 2 through B's cache):
  *cold*: the reading node restarted with its cache deleted, the page cache
  dropped; *warm*: the same files again (sealed: the kernel keeps their
  pages). Every read is checked against the written bytes' CRC32C.
  Target: remote ≥ 0.9 times local-owner, cold and warm.
* **Spark.** --spark-size MiB of JSON lines spread over segments of all
  three nodes (sealed, flushed), and the same bytes in local files; a Spark
  standalone cluster from the pyspark package with one worker per node,
  each worker in its own mount namespace where one path shows its node's
  mount (tests/helpers/spark_cluster.py). ``spark.read.text(...).count()``
  and ``spark.read.json(...).count()`` over the mounted path against the
  local files, page cache dropped before each (the gateways' caches stay:
  restarting them would pull the mounts out from under the workers).

Medians of --rounds runs. Prints one JSON document; --write-table rewrites
the section of docs/PERFORMANCE.md. Needs root (mounts, namespaces,
drop_caches). --quick: 256 MiB / 96 MiB, one round.
"""

from __future__ import annotations

import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import crc32c

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    argument_parser,
    drop_page_cache,
    log,
    print_result,
    replace_table,
    result_header,
)
from gateway.embedded import EmbeddedS3
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import NODES, Cluster, wait_for

MiB = 1024 * 1024
SEGMENTS = 8
TARGET = 0.9
TABLE_START = "<!-- bench/cluster_read.py:start -->"
TABLE_END = "<!-- bench/cluster_read.py:end -->"


def dd(paths: list[pathlib.Path]) -> float:
    """Seconds to read ``paths`` one after another with dd bs=1M (opens included)."""
    started = time.monotonic()
    for p in paths:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=1M"], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    return time.monotonic() - started


def crc_of(paths: list[pathlib.Path]) -> int:
    crc = 0
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(4 * MiB):
                crc = crc32c.crc32c(chunk, crc)
    return crc


def write_read_set(cluster: Cluster, size: int) -> tuple[list[str], int]:
    """Sealed, flushed segments of seeded random bytes on node A; (names, crc32c)."""
    rng = random.Random(16)
    per = size // SEGMENTS
    names = [f"bench/read/s{i}" for i in range(SEGMENTS)]
    crc = 0
    with cluster.client("node-a") as c:
        for name in names:
            c.create(name)
            for _ in range(per // MiB):
                block = rng.randbytes(MiB)
                crc = crc32c.crc32c(block, crc)
                c.append(name, block)
            c.seal(name)
            c.flush(name)
    return names, crc


def write_spark_set(cluster: Cluster, size: int, local: pathlib.Path) -> int:
    """JSON lines on every node (two segments each) and in local files; the line count."""
    pad = "y" * 100
    lines = 0
    per_segment = size // (2 * len(NODES))
    for node in NODES:
        with cluster.client(node) as c:
            for j in range(2):
                name = f"bench/spark/{node}-{j}"
                c.create(name)
                out = (local / f"{node}-{j}").open("wb")
                written = 0
                n = 0
                while written < per_segment:
                    block = b"".join(
                        b'{"node":"%s","n":%d,"k":%d,"pad":"%s"}\n'
                        % (node.encode(), n + i, (n + i) % 97, pad.encode())
                        for i in range(5000)
                    )
                    n += 5000
                    c.append(name, block)
                    out.write(block)
                    written += len(block)
                out.close()
                lines += n
                c.seal(name)
                c.flush(name)
    return lines


def restart_cold(cluster: Cluster, node: str, names: list[str], size: int) -> None:
    """Restart ``node`` with its cache deleted; wait until its mount shows every file whole."""
    d = cluster.daemons[node]
    d.stop(timeout=60)
    subprocess.run(["rm", "-rf", str(d.data_dir / "cache")], check=True)
    d.start(timeout=60)
    wait_for(lambda: all((d.mnt / n).exists() and (d.mnt / n).stat().st_size == size
                         for n in names), 30, f"{node}'s mount")  # fmt: skip


def mount_reads(
    cluster: Cluster, names: list[str], crc: int, size: int, rounds: int
) -> dict[str, Any]:
    per = size // SEGMENTS
    kinds = ("local_cold", "remote_cold", "local_warm", "remote_warm")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        order = [("local", "node-a"), ("remote", "node-b")]
        if r % 2:
            order.reverse()
        for label, node in order:
            restart_cold(cluster, node, names, per)
            paths = [cluster.daemons[node].mnt / n for n in names]
            drop_page_cache(log)
            cold = dd(paths)
            warm = statistics.median(dd(paths) for _ in range(3))
            results[f"{label}_cold"].append(size / cold / 1e9)
            results[f"{label}_warm"].append(size / warm / 1e9)
            got = crc_of(paths)
            if got != crc:
                raise SystemExit(f"{label} read through {node}: CRC32C {got:08x} != {crc:08x}")
            log(f"round {r + 1}: {label} ({node}) cold {size / cold / 1e9:.2f} GB/s, "
                f"warm {size / warm / 1e9:.2f} GB/s")  # fmt: skip
    med = {k: statistics.median(v) for k, v in results.items()}
    return {
        "gbps": med,
        "runs": results,
        "ratio_cold": med["remote_cold"] / med["local_cold"],
        "ratio_warm": med["remote_warm"] / med["local_warm"],
    }


def spark_counts(
    cluster: Cluster, work: pathlib.Path, local: pathlib.Path, lines: int, rounds: int
) -> dict[str, Any]:
    from tests.helpers.spark_cluster import SparkCluster

    fixed = work / "segments"
    fixed.mkdir()
    spark_cluster = SparkCluster(work / "spark", fixed, [cluster.daemons[n].mnt for n in NODES])
    subprocess.run(["mount", "--bind", str(cluster.daemons["node-a"].mnt), str(fixed)],
                   check=True)  # fmt: skip
    kinds = ("mount_text", "local_text", "mount_json", "local_json")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        spark_cluster.start()
        spark = spark_cluster.session("bench-cluster-read")
        queries = {
            "text": lambda uri: spark.read.text(uri).count(),
            "json": lambda uri: spark.read.json(uri).count(),
        }
        uris = {"mount": f"file://{fixed}/bench/spark/*", "local": f"file://{local}/*"}
        for kind, query in queries.items():
            query(uris["mount"])  # the first job starts the Python workers
            for r in range(rounds):
                order = ["mount", "local"] if r % 2 == 0 else ["local", "mount"]
                for where in order:
                    drop_page_cache(log)
                    started = time.monotonic()
                    n = query(uris[where])
                    took = time.monotonic() - started
                    if n != lines:
                        raise SystemExit(f"spark {kind} over {where}: {n} rows, not {lines}")
                    times[f"{where}_{kind}"].append(took)
                    log(f"spark {kind} over {where}: {took:.2f} s")
    finally:
        spark_cluster.stop()
        subprocess.run(["umount", "-l", str(fixed)], check=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "seconds": med,
        "runs": times,
        "ratio_text": med["local_text"] / med["mount_text"],
        "ratio_json": med["local_json"] / med["mount_json"],
    }


def table(result: dict[str, Any]) -> list[str]:
    m, s = result["mount"], result["spark"]
    g = m["gbps"]
    return [
        TABLE_START,
        f"Measured {result['when']} on {result['machine']}: {result['size_mib']} MiB through the "
        f"mount, {result['spark_mib']} MiB of JSON lines for Spark, medians of "
        f"{result['rounds']} rounds (bench/cluster_read.py).",
        "",
        "| read | local owner | another node | ratio (target ≥ 0.9) |",
        "|---|---|---|---|",
        f"| mount, cold (cache wiped, page cache dropped) | {g['local_cold']:.2f} GB/s | "
        f"{g['remote_cold']:.2f} GB/s | **{m['ratio_cold']:.2f}** |",
        f"| mount, warm (page cache) | {g['local_warm']:.2f} GB/s | {g['remote_warm']:.2f} GB/s "
        f"| **{m['ratio_warm']:.2f}** |",
        "",
        "| Spark on 3 nodes (1 executor each) | local files | the mount | mount ÷ local speed |",
        "|---|---|---|---|",
        f"| `read.text().count()`, page cache dropped | {s['seconds']['local_text']:.2f} s | "
        f"{s['seconds']['mount_text']:.2f} s | **{s['ratio_text']:.2f}** |",
        f"| `read.json().count()`, page cache dropped | {s['seconds']['local_json']:.2f} s | "
        f"{s['seconds']['mount_json']:.2f} s | **{s['ratio_json']:.2f}** |",
        TABLE_END,
    ]


def main() -> None:
    parser = argument_parser(
        __doc__, work_dir=None, repeat=None, quick_help="256 MiB / 96 MiB, one round"
    )
    parser.add_argument("--size", type=int, default=1024, help="MiB read through the mounts")
    parser.add_argument("--spark-size", type=int, default=384, help="MiB of JSON for Spark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.size, args.spark_size, args.rounds = 256, 96, 1
    size = args.size * MiB
    work = pathlib.Path(tempfile.mkdtemp(prefix="cluster-read-", dir="/var/tmp"))
    s3 = EmbeddedS3(work / "s3")
    s3.start()
    cluster: Cluster | None = None
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        storage = S3Storage(bucket, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                            secret_key=s3.secret_key)  # fmt: skip
        storage.create_bucket_if_missing()
        storage.close()
        cluster = Cluster(work / "nodes", s3)
        cluster.start()
        log(f"writing {args.size} MiB on node-a")
        names, crc = write_read_set(cluster, size)
        result: dict[str, Any] = {
            **result_header("cluster_read"),
            "size_mib": args.size,
            "spark_mib": args.spark_size,
            "rounds": args.rounds,
        }
        result["mount"] = mount_reads(cluster, names, crc, size, args.rounds)
        if not args.no_spark:
            local = work / "local"
            local.mkdir()
            log(f"writing {args.spark_size} MiB of JSON lines over three nodes")
            lines = write_spark_set(cluster, args.spark_size * MiB, local)
            for node in NODES:
                mnt = cluster.daemons[node].mnt
                wait_for(lambda mnt=mnt: len(list((mnt / "bench/spark").iterdir())) == 6, 10,
                         "every Spark segment on every node")  # fmt: skip
            result["spark_lines"] = lines
            result["spark"] = spark_counts(cluster, work, local, lines, args.rounds)
        print_result(result)
        if args.write_table and not args.no_spark:
            replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    finally:
        if cluster is not None:
            cluster.teardown()
        s3.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
