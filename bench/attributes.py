#!/usr/bin/env python3
"""Attributes at scale: seed 003's experiments with the real index code, writers, lookups.

Three parts, one JSON document:

- **seed** -- seed 003's two tables with `gateway.attrindex.btree` (32 KiB
  pages) over an attribute segment in memory that keeps only live pages
  (pages below the tree's ``start`` are dropped after every batch, as the
  storage writer deletes their chunks). Table 1: N keys inserted in sorted
  order in batches of 10, 100, 1000. Table 2: N keys bulk-loaded (sorted,
  batches of 10,000), then all updated in random order in batches of 10,
  100, 1000. Each with and without progressive compaction; reported: the
  index size after truncation (``length - start``), total bytes written,
  and the seed's published figure beside it (N = 1,000,000 there).
- **writers** -- exactly-once append throughput on one segment with W
  distinct writers (10, 10^4, 10^6), in-process (container + storage writer
  over the filesystem binding, default configuration): first every writer
  appends once (not timed: it fills the index), then M appends by writers
  drawn at random, each conditional on its previous event number; appends
  per second, pipelined 1,000 at a time. Baseline: the 10-writer rate of the
  same run (target: >= 0.8 at 10^6).
- **lookup** -- one segment's index holding 10^7 attributes (built through
  `AttributeIndexStore` batches of 10,000 over the filesystem binding);
  single-key lookups of random keys: cold (fresh caches) and warm (upper
  levels parsed in memory, leaves not), Tier-2 page reads per lookup and
  latency percentiles; baseline: one raw 32 KiB ranged read of a chunk of
  the same binding (target: warm <= 1 Tier-2 read per lookup).

``--quick`` shrinks everything tenfold or more; ``--parts`` picks parts
(``--seed-tables``: the seed part's two tables alone).
Medians of ``--repeat`` runs where a part is timed. ``--write-table``
rewrites the section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import json
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time
from functools import partial
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import trio
from common import argument_parser, log, print_result, replace_table, result_header

from gateway.attrindex.btree import BTree, PageCache, TreeState
from gateway.config import Config
from gateway.container.container import PendingOperation
from gateway.errors import Overloaded
from gateway.protocol.metadata_pb2 import AttributeIndexRecord

TABLE_START = "<!-- bench/attributes.py:start -->"
TABLE_END = "<!-- bench/attributes.py:end -->"
MB = 1_000_000

#: Seed 003's published index sizes in MB (1,000,000 attributes): batch size ->
#: (no compaction, progressive compaction).
SEED_TABLE_1 = {10: (3991, 115), 100: (416, 97), 1000: (60, 54)}
SEED_TABLE_2 = {10: (32990, 72), 100: (29402, 103), 1000: (17083, 91)}


def key_of(i: int) -> bytes:
    """The i-th key: 16-byte big-endian (sorted order = numeric order)."""
    return i.to_bytes(16, "big")


# -- seed 003's tables -------------------------------------------------------------------


class LivePages:
    """An attribute segment in memory that keeps only live pages.

    Sizes are offsets (``length - start``), as in Tier 2; the bytes of dead
    pages are dropped at once (`Batch.replaced`) so a run without
    compaction, which writes tens of GB, fits in memory.
    """

    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}
        self.written = 0

    def read(self, offset: int, length: int) -> bytes:
        return self.pages[offset]

    def store(self, tree: BTree, batch: Any) -> None:
        for offset, length in batch.pages:
            rel = offset - tree.state.length
            self.pages[offset] = batch.data[rel : rel + length]
        for offset in batch.replaced:
            self.pages.pop(offset, None)
        self.written += len(batch.data)
        tree.commit(batch)


def run_seed_case(n: int, batch: int, compaction: bool, update: bool) -> dict[str, Any]:
    pages = LivePages()
    # Live pages of 10^6 attributes are ~70 MB: a budget above that, so the
    # tree rarely reads, and dead pages leave the cache as they age.
    tree = BTree(TreeState(), pages.read, cache=PageCache(256 * 1024 * 1024), compaction=compaction)
    started = time.perf_counter()
    batches = 0
    if update:
        for i in range(0, n, 10_000):
            pages.store(tree, tree.prepare({key_of(k): k for k in range(i, min(n, i + 10_000))}))
        pages.written = 0  # the bulk load is not part of the experiment
        order = list(range(n))
        random.Random(3).shuffle(order)
        for i in range(0, n, batch):
            pages.store(tree, tree.prepare({key_of(k): -k for k in order[i : i + batch]}))
            batches += 1
    else:
        for i in range(0, n, batch):
            pages.store(tree, tree.prepare({key_of(k): k for k in range(i, min(n, i + batch))}))
            batches += 1
    # The tree as the batches left it, read back from the live pages alone
    # (outside the timing): every page parses and fits, nothing is missing.
    elapsed = time.perf_counter() - started
    problems = tree.verify()
    assert not problems and tree.count() == n, problems[:5]
    s = tree.state
    return {
        "attributes": n,
        "batch": batch,
        "compaction": compaction,
        "batches": batches,
        "size_after_truncation_mb": round((s.length - s.start) / MB, 1),
        "written_mb": round(pages.written / MB, 1),
        "seconds": round(elapsed, 1),
    }


def part_seed(n: int, tables: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"attributes": n, "table1": [], "table2": []}
    for table, update, seed in (("table1", False, SEED_TABLE_1), ("table2", True, SEED_TABLE_2)):
        if table not in tables:
            continue
        for batch in (10, 100, 1000):
            for compaction in (False, True):
                case = run_seed_case(n, batch, compaction, update)
                case["seed_mb"] = seed[batch][1 if compaction else 0]
                out[table].append(case)
                log(f"{table} {case}")
    return out


# -- exactly-once writers -----------------------------------------------------------------


def _config(data_dir: pathlib.Path) -> Config:
    return Config.from_dict(
        {
            "node": {"data_dir": str(data_dir)},
            "tier2": {"url": f"file://{data_dir}/tier2"},
        }
    )


async def _writers_rate(
    data_dir: pathlib.Path, writers: int, appends: int, repeat: int
) -> dict[str, Any]:
    from gateway.node import open_node
    from gateway.storage.filesystem import FileStorage
    from gateway.storage.layer import ChunkLayer

    config = _config(data_dir)
    layer = ChunkLayer(FileStorage(data_dir / "tier2"), max_concurrency=4)
    ids = [b"\x01" + i.to_bytes(15, "big") for i in range(writers)]
    rng = random.Random(writers)
    rng.shuffle(ids)
    last = [0] * writers
    async with open_node(config, layer) as node:
        c = node.container
        await (await c.admit(partial(c.prepare_create, "w"), 1024)).wait()

        async def run(order: list[int]) -> float:
            started = time.perf_counter()
            for i in range(0, len(order), 1000):
                ops = []
                for w in order[i : i + 1000]:
                    prev = last[w]
                    last[w] = prev + 1

                    def prepare(w: int = w, prev: int = prev) -> PendingOperation:
                        return c.prepare_append(
                            "w",
                            b"event",
                            writer_id=ids[w],
                            event_number=prev + 1,
                            previous_event_number=prev,
                        )

                    while True:
                        try:
                            op = await c.admit(prepare, 1024)
                            break
                        except Overloaded:  # values wait for the index: as a writer would
                            await trio.sleep(0.005)
                    ops.append(op)
                for op in ops:
                    await op.wait()
            return time.perf_counter() - started

        await run(list(range(writers)))  # every writer once: fills the index
        await c.flush()
        rates = []
        for _ in range(repeat):
            order = [rng.randrange(writers) for _ in range(appends)]
            rates.append(appends / await run(order))
        stats = node.storage_writer.attributes.statistics() if node.storage_writer else None
        seg = c._committed("w")
        assert seg.core(b"\x00" * 15 + b"\x01") == writers + repeat * appends
        return {
            "writers": writers,
            "appends": appends,
            "runs": [round(r) for r in rates],
            "appends_per_s": round(statistics.median(rates)),
            "in_memory": len(seg.attributes),
            "index_batches": stats.batches if stats else 0,
            "tier2_page_reads": stats.tier2_page_reads if stats else 0,
        }


def part_writers(counts: list[int], appends: int, repeat: int) -> dict[str, Any]:
    """One node per writer count (filled once, then ``repeat`` timed runs, median).

    The baseline (the first count) is measured first and again last; the
    ratio is to the mean of its two medians, so drift during the part shows.
    """
    rows = []
    for writers in [*counts, counts[0]]:
        with tempfile.TemporaryDirectory(prefix="bench-attrs-") as d:
            rows.append(trio.run(_writers_rate, pathlib.Path(d), writers, appends, repeat))
        log(f"writers {rows[-1]}")
    again = rows.pop()
    base = (rows[0]["appends_per_s"] + again["appends_per_s"]) / 2
    for r in rows:
        r["ratio"] = round(r["appends_per_s"] / base, 2)
    return {
        "baseline_writers": counts[0],
        "baseline_before_after": [rows[0]["appends_per_s"], again["appends_per_s"]],
        "rows": rows,
    }


# -- lookups at 10^7 -----------------------------------------------------------------------


async def _lookups(data_dir: pathlib.Path, n: int, probes: int) -> dict[str, Any]:
    from cache import CacheStore
    from gateway.attrindex.store import AttributeIndexStore
    from gateway.storage.filesystem import FileStorage
    from gateway.storage.layer import ChunkLayer

    layer = ChunkLayer(FileStorage(data_dir / "tier2"), max_concurrency=4)
    index = AttributeIndexRecord()
    builder = AttributeIndexStore(layer, "node-1", None)
    started = time.perf_counter()
    uploading: set[str] = set()
    for i in range(0, n, 10_000):
        batch, chunk = await builder.write_batch(
            1, "s", index, {key_of(k * 7): k for k in range(i, min(n, i + 10_000))}, 1, uploading
        )
        builder.committed(1, index, batch)
        st = batch.state
        index.root_offset, index.root_length = st.root_offset, st.root_length
        index.length, index.start = st.length, st.start
        index.chunks.append(chunk)
        keep = [c for c in index.chunks if c.start_offset + c.length > st.start]
        del index.chunks[:]
        index.chunks.extend(keep)
    build_s = time.perf_counter() - started
    rng = random.Random(7)

    # Baseline: one raw ranged read of a page-sized piece of a chunk.
    raw = []
    for _ in range(probes):
        chunk = rng.choice(list(index.chunks))
        off = rng.randrange(max(1, chunk.length - 32768))
        t0 = time.perf_counter()
        await layer.read(chunk.name, off, 32768)
        raw.append(time.perf_counter() - t0)

    async def measure(store: AttributeIndexStore, label: str) -> dict[str, Any]:
        times = []
        reads0 = store.tier2_page_reads
        hits0 = store.rocksdb_page_hits
        for _ in range(probes):
            k = key_of(rng.randrange(n) * 7)
            t0 = time.perf_counter()
            got = await store.lookup(1, index, [k])
            times.append(time.perf_counter() - t0)
            assert len(got) == 1
        times.sort()
        return {
            "case": label,
            "lookups": probes,
            "tier2_reads_per_lookup": round((store.tier2_page_reads - reads0) / probes, 2),
            "rocksdb_hits_per_lookup": round((store.rocksdb_page_hits - hits0) / probes, 2),
            "p50_ms": round(1000 * times[len(times) // 2], 3),
            "p99_ms": round(1000 * times[int(len(times) * 0.99)], 3),
        }

    cache = CacheStore.open(data_dir / "cache", 256 * 1024 * 1024, 0.5)
    try:
        cold = AttributeIndexStore(layer, "node-1", cache, page_cache_bytes=1)
        rows = [await measure(cold, "cold: no page parsed in memory, RocksDB empty at first")]
        warm = AttributeIndexStore(layer, "node-1", cache)
        # Warm the upper levels: every index page parsed in memory (leaves are not).
        tree = warm.tree(1, index)
        await trio.to_thread.run_sync(_warm_upper_levels, tree)
        rows.append(await measure(warm, "warm: upper levels in memory, leaves in Tier 2"))
        rows.append(await measure(warm, "warm, a second round (leaves read so far cached)"))
    finally:
        cache.close()
    raw.sort()
    return {
        "attributes": n,
        "index_mb": round((index.length - index.start) / MB, 1),
        "chunks": len(index.chunks),
        "build_s": round(build_s, 1),
        "raw_read_p50_ms": round(1000 * raw[len(raw) // 2], 3),
        "rows": rows,
    }


def _warm_upper_levels(tree: BTree) -> None:
    """Parse every index (non-leaf) page into the tree's cache, and no leaf."""
    from gateway.attrindex.btree import INDEX

    root = tree._root()
    if root is None:
        return
    # The tree's height, from its leftmost path (all leaves are at one depth).
    height, page = 1, root
    while page.kind == INDEX:
        page = tree._load(*page.child(0)[:2])
        height += 1
    level = [root]
    for _ in range(height - 2):  # every level down to the leaves' parents
        nxt = []
        for page in level:
            for i in range(len(page.keys)):
                nxt.append(tree._load(*page.child(i)[:2]))
        level = nxt


def part_lookup(n: int, probes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-attrs-") as d:
        return trio.run(_lookups, pathlib.Path(d), n, probes)


# -- the table ---------------------------------------------------------------------------------


def table_lines(doc: dict[str, Any]) -> list[str]:
    lines = [TABLE_START, ""]
    lines.append(f"Machine: {doc['machine']}, {doc['python']}; {doc['when']}.")
    seed = doc.get("seed")
    if seed:
        lines += [
            "",
            "Seed 003's experiments (the seed: 1,000,000 attributes), index size in Tier 2 "
            "after truncation in MB; without compaction the seed's figure is what was written "
            "(nothing before the oldest untouched page can go), ours is given both ways:",
            "",
            "| table | attributes | batch | ours, no compaction: after truncation / written "
            "| seed, no compaction | ours, progressive compaction | seed, progressive "
            "compaction | seconds (no / with) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, label in (("table1", "1: sorted inserts"), ("table2", "2: random updates")):
            cases = seed.get(name) or []
            for batch in sorted({c["batch"] for c in cases}):
                off = next(c for c in cases if c["batch"] == batch and not c["compaction"])
                on = next(c for c in cases if c["batch"] == batch and c["compaction"])
                lines.append(
                    f"| {label} | {on.get('attributes', seed['attributes']):,} | {batch} | "
                    f"{off['size_after_truncation_mb']:,} / "
                    f"{off['written_mb']:,} | {off['seed_mb']:,} | "
                    f"{on['size_after_truncation_mb']:,} | {on['seed_mb']:,} | "
                    f"{off['seconds']} / {on['seconds']} |"
                )
    writers = doc.get("writers")
    if writers:
        lines += [
            "",
            "Exactly-once appends on one segment (in-process, filesystem Tier 2; median "
            f"of the timed runs), ratio to {writers['baseline_writers']} writers, measured "
            f"before and after ({writers['baseline_before_after'][0]:,} and "
            f"{writers['baseline_before_after'][1]:,} appends/s; target >= 0.8 at 10^6):",
            "",
            "| writers | appends/s | ratio | values in memory | index batches "
            "| Tier-2 page reads |",
            "|---|---|---|---|---|---|",
        ]
        for r in writers["rows"]:
            lines.append(
                f"| {r['writers']:,} | {r['appends_per_s']:,.0f} | {r['ratio']} | "
                f"{r['in_memory']:,} | {r['index_batches']} | {r['tier2_page_reads']:,} |"
            )
    lookup = doc.get("lookup")
    if lookup:
        lines += [
            "",
            f"Single-key lookups, {lookup['attributes']:,} attributes "
            f"({lookup['index_mb']} MB index, {lookup['chunks']} chunks, built in "
            f"{lookup['build_s']} s); baseline: a raw 32 KiB ranged read, p50 "
            f"{lookup['raw_read_p50_ms']} ms (target: warm <= 1 Tier-2 read):",
            "",
            "| case | Tier-2 reads per lookup | RocksDB page hits per lookup | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
        ]
        for r in lookup["rows"]:
            lines.append(
                f"| {r['case']} | {r['tier2_reads_per_lookup']} | "
                f"{r['rocksdb_hits_per_lookup']} | {r['p50_ms']} | {r['p99_ms']} |"
            )
    lines += ["", TABLE_END]
    return lines


def main() -> None:
    ap = argument_parser(__doc__, work_dir=None, quick_help="smaller sizes, one run", table="MD")
    ap.add_argument("--parts", default="table1,table2,writers,lookup", help="comma-separated parts")
    ap.add_argument(
        "--seed-tables", action="store_true", help="only seed 003's tables (--parts table1,table2)"
    )
    ap.add_argument(
        "--merge",
        type=pathlib.Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: merge the parts of earlier outputs (later files win) for the table",
    )
    args = ap.parse_args()
    parts = {"table1", "table2"} if args.seed_tables else set(args.parts.split(","))
    repeat = 1 if args.quick else args.repeat
    doc: dict[str, Any] = {
        **result_header("attributes"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "quick": args.quick,
    }
    if args.merge:
        for path in args.merge:
            earlier = json.loads(path.read_text())
            for part in ("writers", "lookup"):
                if part in earlier:
                    doc[part] = earlier[part]
            if "seed" in earlier:
                seed = doc.setdefault("seed", {"attributes": earlier["seed"]["attributes"]})
                for table in ("table1", "table2"):
                    if earlier["seed"].get(table):
                        seed[table] = earlier["seed"][table]
                        seed["attributes"] = earlier["seed"]["attributes"]
        parts = set()
    tables = [t for t in ("table1", "table2") if t in parts]
    if tables:
        doc["seed"] = part_seed(100_000 if args.quick else 1_000_000, tables)
    if "writers" in parts:
        counts = [10, 10_000, 100_000] if args.quick else [10, 10_000, 1_000_000]
        doc["writers"] = part_writers(counts, 20_000 if args.quick else 100_000, repeat)
    if "lookup" in parts:
        doc["lookup"] = part_lookup(1_000_000 if args.quick else 10_000_000, 300)
    print_result(doc)
    if args.write_table:
        replace_table(args.write_table, TABLE_START, TABLE_END, table_lines(doc))


if __name__ == "__main__":
    main()
