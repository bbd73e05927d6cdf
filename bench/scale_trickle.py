"""The trickle part of `bench/scale.py`: slow segments flushed many times, the
chunk objects and Tier-2 requests that makes, with the storage optimizer off
and on, and cold reads before and after packing (see `bench/scale.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    drop_page_cache,
    log,
    met,
)
from scale_nodes import (  # noqa: E402
    CONNECTIONS,
    DEFRAG_INTERVAL,
    DEFRAG_TIER2,
    EVENT,
    MAX_CHUNK_SIZE,
    SETTLE_TIMEOUT,
    TASKS,
    TRICKLE_END,
    TRICKLE_START,
    TRICKLE_TIER2,
    Daemon,
    bucket_of_its_own,
    create_all,
    flushed,
    node_config,
    objects,
    objects_cell,
    ratio,
    timed,
    wait_for,
)

from gateway.client.client import ResponseFuture, open_client  # noqa: E402

#: The defrag-on arm: the merge rule lowered to runs of 8 small chunks (default 16), so a
#: trickle of a few minutes (the writer goes round 1,000 segments every few seconds on a
#: loaded 2-core machine) goes through several merge cycles per segment; the optimizer's
#: look every 10 s, replaced objects deleted after 5 s (DEFRAG_TIER2); the rest default.
MIN_CHUNKS = 8
ON_TIER2 = DEFRAG_TIER2 + f"defrag_min_chunks = {MIN_CHUNKS}\n"
#: Seconds between two samples of the chunks named per segment during the trickle.
SAMPLE_EVERY = 30.0


async def trickle(address: str, names: list[str], seconds: float,
                  samples: list[dict[str, float]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One event a second to every segment for ``seconds``; appends made and rounds late.

    With ``samples``: the chunks the node names per segment, every SAMPLE_EVERY s.
    """
    rounds = late = 0
    async with open_client(address) as client, trio.open_nursery() as nursery:
        started = trio.current_time()
        if samples is not None:
            nursery.start_soon(sample_chunks, address, started, seconds, samples)
        while trio.current_time() - started < seconds:
            due = started + rounds + 1
            futures: list[ResponseFuture] = []
            for name in names:
                futures.append(await client.start_append(name, EVENT))
            for f in futures:
                await f.wait()
            rounds += 1
            now = trio.current_time()
            if now > due:
                late += 1
            else:
                await trio.sleep(due - now)
    return {"rounds": rounds, "appends": rounds * len(names), "rounds_late": late}


async def sample_chunks(address: str, started: float, seconds: float,
                        samples: list[dict[str, float]]) -> None:  # fmt: skip
    """Every SAMPLE_EVERY s while the trickle lasts: chunks named per segment (listing)."""
    async with open_client(address) as client:
        k = 1
        while k * SAMPLE_EVERY <= seconds:
            await trio.sleep_until(started + k * SAMPLE_EVERY)
            counts = sorted(s.chunk_count for s in await client.list("fleet/", local_only=True))
            samples.append({"t": k * SAMPLE_EVERY, "mean": statistics.mean(counts),
                            "median": statistics.median(counts), "max": counts[-1]})  # fmt: skip
            k += 1


async def one_at_a_time(address: str, name: str, count: int) -> list[float]:
    """``count`` appends to ``name``, each waited for: their latencies in seconds."""
    out = []
    async with open_client(address) as client:
        for _ in range(count):
            t = time.monotonic()
            await client.append(name, EVENT)
            out.append(time.monotonic() - t)
    return out


def checkpoint_frames(journal: pathlib.Path) -> list[int]:
    """Payload bytes of every checkpoint frame in a stopped node's journal (journal-dump)."""
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "journal-dump", "--json", str(journal)],
        capture_output=True, text=True, cwd=ROOT, timeout=900, check=False,
    ).stdout  # fmt: skip
    sizes = []
    for line in out.splitlines():
        row = json.loads(line)
        if any("checkpoint" in k for k in row.get("kinds", {})):
            sizes.append(row["payload_bytes"])
    return sizes


# -- part 1: the trickle -------------------------------------------------------------


def chunk_objects(s3c: Any, bucket: str, node_id: str, segments: int) -> dict[str, Any]:
    """The chunk objects under the node's ``chunks/`` prefix (boto3), per segment."""
    objs = objects(s3c, bucket, f"gw/{node_id}/chunks/")
    per: dict[str, int] = {}
    for o in objs:
        seg = o["Key"].split("/")[3]
        per[seg] = per.get(seg, 0) + 1
    counts = sorted(per.values())
    return {
        "objects": len(objs),
        "mean": len(objs) / segments,
        "min": counts[0] if counts else 0,
        "median": statistics.median(counts) if counts else 0,
        "max": counts[-1] if counts else 0,
        "bytes_mean": sum(o["Size"] for o in objs) / max(1, len(objs)),
    }


async def pipelined(address: str, names: list[str], one: Callable[[Any, str], Any]) -> None:
    """``await one(client, name)`` for each name, TASKS in flight over CONNECTIONS."""
    todo = iter(names)

    async def worker(client: Any) -> None:
        for name in todo:
            await one(client, name)

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(address))
                   for _ in range(CONNECTIONS)]  # fmt: skip
        async with trio.open_nursery() as nursery:
            for k in range(TASKS):
                nursery.start_soon(worker, clients[k % CONNECTIONS])


async def named_chunks(address: str, prefix: str) -> int:
    """Chunks the node's metadata names for the segments under ``prefix``."""
    async with open_client(address) as client:
        return sum(s.chunk_count for s in await client.list(prefix, local_only=True))


def defrag_counters(node: Daemon) -> dict[str, float]:
    m = node.metrics()
    p = "segment_gateway_defrag_"
    return {k: m.get(p + k + "_total", 0.0) for k in
            ("runs", "chunks_replaced", "objects_deleted", "failures")}  # fmt: skip


def optimizer_settled(node: Daemon, quiet: float) -> float:
    """Wait until the optimizer merged nothing for ``quiet`` s and its replaced objects
    went to deletion; the seconds waited."""
    started = time.monotonic()
    last = defrag_counters(node)
    since = time.monotonic()
    while True:
        time.sleep(1.0)
        now = defrag_counters(node)
        if now["runs"] != last["runs"] or now["objects_deleted"] < now["chunks_replaced"]:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return time.monotonic() - started
        if time.monotonic() - started > SETTLE_TIMEOUT:
            raise RuntimeError(f"the optimizer still busy after {SETTLE_TIMEOUT:.0f}s: {now}")


def objects_settled(node: Daemon, s3c: Any, bucket: str) -> float:
    """Wait until the bucket holds only the chunk objects the node names (the replaced ones
    deleted); the seconds waited."""
    named = trio.run(named_chunks, node.address, "fleet/")
    return wait_for(lambda: len(objects(s3c, bucket, f"gw/{node.name}/chunks/")) <= named,
                    "the replaced objects deleted", timeout=600)  # fmt: skip


def cold_mount_read(node: Daemon, names: list[str]) -> dict[str, Any]:
    """Every segment read through the mount (Python reads, one file after another), the node
    started on an empty cache directory and the page cache dropped."""
    node.stop()
    node.start(fresh_cache=True)
    drop_page_cache(warn=log)
    before = node.tier2_requests()
    assert node.mountpoint is not None
    mnt = node.mountpoint
    t = time.monotonic()
    total = 0
    for name in names:
        with open(mnt / name, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    took = time.monotonic() - t
    after = node.tier2_requests()
    return {
        "seconds": took, "bytes": total, "MBps": total / took / 1e6,
        "files_per_s": len(names) / took,
        "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after},
    }  # fmt: skip


def cold_spark_count(node: Daemon, spark: Any, lines: int) -> dict[str, Any]:
    """``spark.read.text(<mount>/fleet).count()``, the node started on an empty cache
    directory and the page cache dropped; checked to count every line."""
    node.stop()
    node.start(fresh_cache=True)
    drop_page_cache(warn=log)
    assert node.mountpoint is not None
    before = node.tier2_requests()
    t = time.monotonic()
    count = spark.read.text(f"file://{node.mountpoint}/fleet").count()
    took = time.monotonic() - t
    after = node.tier2_requests()
    if count != lines:
        raise RuntimeError(f"Spark counted {count} lines through the mount, appended {lines}")
    return {"seconds": took, "lines": count,
            "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after}}  # fmt: skip


def cold_reads(node: Daemon, names: list[str], spark: Any, lines: int, repeat: int,
               steps: dict[str, float], what: str) -> dict[str, Any]:  # fmt: skip
    """The cold Spark count (median of ``repeat``) and one cold read through the mount."""
    out: dict[str, Any] = {}
    if spark is not None:
        runs = [
            timed(f"trickle: {what}: cold Spark count {r + 1}", steps)(
                lambda: cold_spark_count(node, spark, lines)
            )
            for r in range(repeat)
        ]
        out["spark"] = {"runs_s": [r["seconds"] for r in runs],
                        "median_s": statistics.median(r["seconds"] for r in runs),
                        "tier2_requests": runs[-1]["tier2_requests"]}  # fmt: skip
    out["mount"] = timed(f"trickle: {what}: cold read through the mount", steps)(
        lambda: cold_mount_read(node, names)
    )
    return out


def run_trickle(work: pathlib.Path, s3: Any, env: dict[str, str], segments: int,
                seconds: float, spark_repeat: int,
                cold: bool = True) -> dict[str, Any]:  # fmt: skip
    """The trickle with ``tier2.defrag`` off and on, on buckets of their own, at once.

    The two nodes trickle at the same time (same load; they start after both
    created their segments), then seal; then, with ``cold``, the defrag-off
    node's segments are read cold before and after it packs them, alone.
    """
    out: dict[str, Any] = {"segments": segments, "seconds": seconds, "tier2": TRICKLE_TIER2,
                           "defrag_tier2": ON_TIER2, "together": True}  # fmt: skip
    spark = None
    try:
        from pipeline.session import local_session

        if spark_repeat > 0 and cold:
            spark = local_session("bench scale trickle")
    except Exception as e:  # measured without Spark, and said so
        out.setdefault("failures", []).append(f"Spark: {type(e).__name__}: {e}")
        log(f"trickle: no Spark: {e}")
    meet = Meeting(threading.Barrier(2), threading.Barrier(2))

    def arm(defrag: bool) -> None:
        key = "on" if defrag else "off"
        out[key] = trickle_once(work, s3, env, segments, seconds, defrag, spark, spark_repeat,
                                meet, cold)  # fmt: skip

    try:
        threads = [threading.Thread(target=arm, args=(d,), name=f"trickle-{d}")
                   for d in (False, True)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key in ("off", "on"):
            if out.get(key, {}).get("failures"):
                out.setdefault("failures", []).extend(f"defrag {key}: {f}"
                                                      for f in out[key]["failures"])  # fmt: skip
    finally:
        if spark is not None:
            spark.stop()
    return out


@dataclasses.dataclass
class Meeting:
    """Where the two arms wait for each other: before the trickle, before the cold reads."""

    start: threading.Barrier
    done: threading.Barrier

    def abort(self) -> None:
        self.start.abort()
        self.done.abort()


def s3_requests(delta: dict[str, float], runs: float, replaced: float) -> dict[str, float]:
    """The layer's requests as S3 requests: a write a PUT, a read a GET, ...; a concat of
    the trickle's small chunks a GET of each source and one PUT (one part, < 5 MiB)."""
    verbs = {"write": "PUT", "read": "GET", "list": "LIST", "delete": "DELETE", "stat": "HEAD"}
    out: dict[str, float] = {}
    for op, n in delta.items():
        if op != "concat":
            out[verbs.get(op, op)] = out.get(verbs.get(op, op), 0) + n
    out["PUT"] = out.get("PUT", 0) + runs
    out["GET"] = out.get("GET", 0) + replaced
    return out


def rewritten_bytes(node: Daemon) -> float:
    """Bytes of merged chunks the optimizer wrote (copied in Tier 2 or uploaded again)."""
    m = node.metrics()
    p = "segment_gateway_defrag_bytes_total"
    return sum(v for k, v in m.items() if k.startswith(p))


def settle(node: Daemon, s3c: Any, bucket: str, defrag: bool, key: str, what: str,
           steps: dict[str, float]) -> None:  # fmt: skip
    """Wait for the last flushes, and with ``defrag`` the optimizer's last merges and the
    deletion of the objects they replaced."""
    timed(f"trickle {key}: {what}: the last flushes", steps)(
        lambda: wait_for(lambda: flushed(node), "flushed")
    )
    if defrag:
        timed(f"trickle {key}: {what}: the optimizer's last look", steps)(
            lambda: optimizer_settled(node, 2 * DEFRAG_INTERVAL + 2)
        )
        timed(f"trickle {key}: {what}: replaced objects deleted", steps)(
            lambda: objects_settled(node, s3c, bucket)
        )


def trickle_once(work: pathlib.Path, s3: Any, env: dict[str, str], segments: int,
                 seconds: float, defrag: bool, spark: Any, spark_repeat: int,
                 meet: Meeting, cold: bool) -> dict[str, Any]:  # fmt: skip
    """One arm: N segments, an event a second each for ``seconds`` (at the same time as
    the other arm), objects per segment active and then sealed.

    With ``cold`` and ``defrag`` off, once both arms are done, the sealed segments
    are read cold (Spark and the mount), the node started again with defrag on
    to pack them, and read cold again: the same segments before and after.
    """
    key = "on" if defrag else "off"
    out: dict[str, Any] = {"defrag": defrag, "steps": {}}
    steps = out["steps"]
    names = [f"fleet/sensor{i:05d}" for i in range(segments)]
    with bucket_of_its_own(s3, f"trickle-{key}") as (bucket, s3c):

        def config(on: bool) -> str:
            tier2 = TRICKLE_TIER2 + (ON_TIER2 if on else "defrag = false\n")
            return node_config("node-t", bucket, s3.endpoint_url, tier2)

        node = Daemon(work / f"trickle-{key}", "node-t", config(defrag), env)
        try:
            steps["start_s"] = round(node.start(), 2)
            timed(f"trickle {key}: create", steps)(
                lambda: trio.run(create_all, node.address, names, None, lambda i: False)
            )
            meet.start.wait(timeout=SETTLE_TIMEOUT)
            before = node.tier2_requests()
            merges_before = defrag_counters(node)
            rewritten_before = rewritten_bytes(node)
            samples: list[dict[str, float]] = []
            t0 = time.monotonic()
            out["load"] = timed(f"trickle {key}: appends", steps)(
                lambda: trio.run(trickle, node.address, names, seconds, samples)
            )
            elapsed = time.monotonic() - t0
            out["samples"] = samples
            after = node.tier2_requests()
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            out["tier2_requests"] = delta
            out["tier2_requests_per_hour"] = {k: v * 3600 / elapsed for k, v in delta.items()}
            merges = defrag_counters(node)
            d = out["defrag_counters"] = {k: merges[k] - merges_before[k] for k in merges}
            s3req = s3_requests(delta, d["runs"], d["chunks_replaced"])
            out["s3_requests_per_hour"] = {k: v * 3600 / elapsed for k, v in s3req.items()}
            out["elapsed_s"] = elapsed
            out["bytes_per_segment"] = out["load"]["rounds"] * len(EVENT)
            written = out["bytes_per_segment"] * segments
            out["rewritten_per_byte"] = (rewritten_bytes(node) - rewritten_before) / written
            out["rss_mib"] = node.rss_mib()
            settle(node, s3c, bucket, defrag, key, "active", steps)
            # Still active: the tail of each segment is its newest object.
            out["chunk_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
            log(f"trickle {key}: active {out['chunk_objects_per_segment']}")
            timed(f"trickle {key}: seal", steps)(
                lambda: trio.run(pipelined, node.address, names, lambda c, n: c.seal(n))
            )
            # With defrag on, a segment sealed in Tier 2 is packed at the optimizer's next look.
            settle(node, s3c, bucket, defrag, key, "sealed", steps)
            out["sealed_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
            out["rewritten_per_byte_sealed"] = (rewritten_bytes(node) - rewritten_before) / written
            log(f"trickle {key}: sealed {out['sealed_objects_per_segment']}")
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.done.wait(timeout=SETTLE_TIMEOUT)  # the other arm ended either way
            if defrag or not cold:
                return out
            cold_and_packed(node, s3c, bucket, names, spark, spark_repeat, config, out)
        except Exception as e:
            meet.abort()  # the other arm does not wait for this one
            out.setdefault("failures", []).append(f"{type(e).__name__}: {e}")
            out["traceback"] = traceback.format_exception(e)[-8:]
            out["daemon_tail"] = node.tail().splitlines()
            log(f"trickle {key} FAILED: {e}")
        finally:
            node.stop()
    return out


def cold_and_packed(node: Daemon, s3c: Any, bucket: str, names: list[str], spark: Any,
                    spark_repeat: int, config: Callable[[bool], str],
                    out: dict[str, Any]) -> None:  # fmt: skip
    """The defrag-off arm's sealed segments read cold, packed by the node started again
    with defrag on, and read cold again."""
    steps = out["steps"]
    segments = len(names)
    lines = out["load"]["rounds"] * segments
    out["before"] = cold_reads(node, names, spark, lines, spark_repeat, steps, "before")
    # Defragmentation switched on: after a start the optimizer looks at every
    # segment once, and packs each sealed one into chunks of max_chunk_size.
    node.stop()
    node.config_text = config(True)
    node.start()
    before = node.tier2_requests()
    t = time.monotonic()
    timed("trickle off: packed by the optimizer", steps)(
        lambda: optimizer_settled(node, 2 * DEFRAG_INTERVAL + 2)
    )
    timed("trickle off: replaced objects deleted", steps)(
        lambda: objects_settled(node, s3c, bucket)
    )
    after = node.tier2_requests()
    out["packing"] = {
        "seconds": time.monotonic() - t,
        "tier2_requests": {k: after.get(k, 0) - before.get(k, 0) for k in after},
        **defrag_counters(node),
    }
    out["packed_objects_per_segment"] = chunk_objects(s3c, bucket, "node-t", segments)
    log(f"trickle off: packed {out['packed_objects_per_segment']}")
    out["after"] = cold_reads(node, names, spark, lines, spark_repeat, steps, "after")
    for when in ("before", "after"):
        total = out[when]["mount"]["bytes"]
        expected = out["bytes_per_segment"] * segments
        if total != expected:
            out.setdefault("failures", []).append(
                f"{when}: read {total} bytes through the mount, appended {expected}"
            )


# -- part 2: scale --------------------------------------------------------------------


def trickle_table(result: dict[str, Any]) -> list[str]:
    """The trickle's tables: defrag off against on; the same segments before and after."""
    tr = result["trickle"]
    lines = [TRICKLE_START]
    off, on = tr.get("off", {}), tr.get("on", {})
    if "sealed_objects_per_segment" not in off or "sealed_objects_per_segment" not in on:
        lines += [f"Trickle: FAILED: {'; '.join(tr.get('failures', []))}", TRICKLE_END]
        return lines
    target = 2 + max(off["bytes_per_segment"], on["bytes_per_segment"]) / MAX_CHUNK_SIZE
    lines += [
        f"Run {result['when']} on {result['machine']}, software {result['version']}: "
        f"{tr['segments']:,} segments, one {len(EVENT)}-byte event a second each for "
        f"{tr['seconds']:.0f} s, `flush_interval` 1 s, with `tier2.defrag` off and on: two "
        "nodes trickling at the same time (the same load), each on a bucket of its own, then "
        f"every segment sealed. Defrag on: `defrag_min_chunks` {MIN_CHUNKS} (default 16), "
        f"`defrag_interval` {DEFRAG_INTERVAL} s, `gc_grace` 5 s, the rest at the defaults "
        "(`defrag_small` 16 MiB, `defrag_rate` 16 MiB/s, `defrag_concurrency` 4). Objects "
        "listed with boto3 once the last flushes, merges and deletions were done; requests "
        "per hour extrapolated from the trickle's.",
        "",
        "| measure | defrag off | defrag on | on ÷ off |",
        "|---|---|---|---|",
        f"| rounds of appends (late) | {off['load']['rounds']} ({off['load']['rounds_late']}) "
        f"| {on['load']['rounds']} ({on['load']['rounds_late']}) | |",
    ]
    for a, b in zip(off.get("samples", []), on.get("samples", []), strict=False):
        lines.append(
            f"| chunks named per segment at {a['t']:.0f} s, mean / max | {a['mean']:.1f} / "
            f"{a['max']} | {b['mean']:.1f} / {b['max']} | {ratio(b['mean'], a['mean'])} |"
        )
    for what, k in (("active, after the trickle", "chunk_objects_per_segment"),
                    ("sealed", "sealed_objects_per_segment")):  # fmt: skip
        lines.append(
            f"| chunk objects per segment, {what}: median / mean / max "
            f"| {objects_cell(off[k])} | {objects_cell(on[k])} "
            f"| {ratio(on[k]['mean'], off[k]['mean'])} |"
        )
    so, sn = off["sealed_objects_per_segment"], on["sealed_objects_per_segment"]
    lines += [
        f"| sealed: at most 2 + size ÷ `max_chunk_size` = {target:.2f} per segment "
        f"| {met(so['max'] <= target)} | {met(sn['max'] <= target)} | |",
        f"| mean object (active), bytes | {off['chunk_objects_per_segment']['bytes_mean']:,.0f} "
        f"| {on['chunk_objects_per_segment']['bytes_mean']:,.0f} | |",
    ]
    for name, k in (("Tier-2", "tier2_requests_per_hour"), ("S3", "s3_requests_per_hour")):
        for op in sorted(set(off[k]) | set(on[k])):
            a, b = off[k].get(op, 0.0), on[k].get(op, 0.0)
            if a or b:
                lines.append(f"| {name} {op} per hour | {a:,.0f} | {b:,.0f} | {ratio(b, a)} |")
        if name == "S3":
            a, b = sum(off[k].values()), sum(on[k].values())
            lines.append(f"| S3 requests per hour, all | {a:,.0f} | {b:,.0f} | {ratio(b, a)} |")
    d = on["defrag_counters"]
    lines += [
        f"| merges (chunks replaced) during the trickle | — | {d['runs']:,.0f} "
        f"({d['chunks_replaced']:,.0f}) | |",
        "| bytes rewritten by the optimizer per byte written: the trickle / and its packing "
        f"once sealed | — | {on['rewritten_per_byte']:.2f} / "
        f"{on['rewritten_per_byte_sealed']:.2f} | |",
        f"| daemon RSS, MiB | {off['rss_mib']:.0f} | {on['rss_mib']:.0f} | |",
        "",
    ]
    if "after" not in off:
        if off.get("failures"):
            lines.append(f"Before and after: FAILED: {'; '.join(off['failures'])}")
        lines.append(TRICKLE_END)  # without failures: not asked for (--trickle-skip-cold)
        return lines
    before, after = off["before"], off["after"]
    sealed, packed = off["sealed_objects_per_segment"], off["packed_objects_per_segment"]
    target = 2 + off["bytes_per_segment"] / MAX_CHUNK_SIZE
    pk = off["packing"]
    lines += [
        "The defrag-off run's segments, sealed, then read cold (node started on an empty "
        "cache directory, page cache dropped) before and after the node, started again with "
        f"defrag on, packed them (`{off['bytes_per_segment']:,}` bytes each; the packing "
        f"took {pk['seconds']:.0f} s, {pk['runs']:,.0f} merges replacing "
        f"{pk['chunks_replaced']:,.0f} chunks).",
        "",
        "| measure | before | after | after ÷ before |",
        "|---|---|---|---|",
        f"| chunk objects per segment, median / mean / max | {objects_cell(sealed)} "
        f"| {objects_cell(packed)} | {ratio(packed['median'], sealed['median'])} |",
        f"| target: at most 2 + size ÷ `max_chunk_size` = {target:.2f} per segment "
        f"| {met(sealed['max'] <= target)} | {met(packed['max'] <= target)} | |",
    ]
    if "spark" in before and "spark" in after:
        sb, sa = before["spark"], after["spark"]
        gets_b = sb["tier2_requests"].get("read", 0)
        gets_a = sa["tier2_requests"].get("read", 0)
        lines += [
            f"| cold Spark `read.text(...).count()` (`local[2]`), median of "
            f"{len(sb['runs_s'])}, s | {sb['median_s']:.1f} | {sa['median_s']:.1f} "
            f"| {ratio(sa['median_s'], sb['median_s'])} |",
            f"| its Tier-2 reads | {gets_b:,.0f} | {gets_a:,.0f} | {ratio(gets_a, gets_b)} |",
        ]
    mb, ma = before["mount"], after["mount"]
    lines += [
        f"| cold read through the mount (one file after another), s | {mb['seconds']:.1f} "
        f"| {ma['seconds']:.1f} | {ratio(ma['seconds'], mb['seconds'])} |",
        f"| its Tier-2 reads | {mb['tier2_requests'].get('read', 0):,.0f} "
        f"| {ma['tier2_requests'].get('read', 0):,.0f} | |",
        TRICKLE_END,
    ]
    return lines
