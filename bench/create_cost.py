#!/usr/bin/env python3
"""Create cost: what one segment create costs in Tier-2 requests, latency and CPU.

In a cluster (any Tier 2 but ``embedded``) a create first claims its name
in Tier 2 with a conditional PUT (`gateway.cluster.claims`); with
``tier2.url = "embedded"`` names are the node's alone and nothing is
claimed: that node is the same-run baseline. One SeaweedFS
(`gateway.embedded.EmbeddedS3`) and one fresh daemon per variant (no
mount; flushes, snapshots and GC held off, so the creates' requests are
what Tier 2 sees); each variant runs three passes of creates of new names:
one at a time on one connection (``1 in flight``), 64 tasks pipelined on
one connection (``64 in flight``), and 64 tasks over each of 4
connections (``4 x 64``, as bench/scale.py loads a node). Measured per
pass: creates/s, the latency of each create (p50, p99), the daemon's CPU
per create (``/proc``) and its Tier-2 requests per create by operation
(its /metrics, ``segment_gateway_tier2_requests``; the heartbeat's few
requests a second fall in too). ``--base DIR`` adds the same variants run
from another checkout (a worktree of the code before a change): its
daemons start with that directory as their working directory, so
``python -m gateway.cli`` imports its ``gateway``. ``--tier2-concurrency
8 32`` runs the claiming variants at each ``tier2.max_concurrency`` (the
bound on claims in flight at once: the chunk layer's limiter).

Prints one JSON document (progress on stderr); --write-table rewrites the
section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import contextlib
import pathlib
import statistics
import sys
import time
import uuid
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402
from common import (  # noqa: E402
    argument_parser,
    log,
    print_result,
    replace_table,
    result_header,
    stop_on_signals,
    work_directory,
)
from scale import Daemon, bucket_of_its_own  # noqa: E402

from gateway.client.client import open_client  # noqa: E402

TABLE_START = "<!-- bench/create_cost.py:start -->"
TABLE_END = "<!-- bench/create_cost.py:end -->"

#: (label, connections, tasks per connection)
PASSES = (("1 in flight", 1, 1), ("64 in flight", 1, 64), ("4 x 64", 4, 64))

HELD_OFF = """
flush_interval = "1h"
snapshot_interval = "1h"
gc_interval = "1h"
"""


def config(node: str, tier2: str, concurrency: int) -> str:
    return f"""
[node]
id = "{node}"
[cache]
dir = "@CACHE@"
budget = "256 MiB"
[tier2]
{tier2}
max_concurrency = {concurrency}
{HELD_OFF}
[journal]
preallocate_step = "8 MiB"
"""


async def creates(address: str, names: list[str], connections: int, tasks: int) -> list[float]:
    """Create ``names`` over ``connections`` x ``tasks``; each create's seconds."""
    todo = iter(names)
    took: list[float] = []

    async def worker(client: Any) -> None:
        for name in todo:
            t = time.perf_counter()
            await client.create(name)
            took.append(time.perf_counter() - t)

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_client(address))
                   for _ in range(connections)]  # fmt: skip
        async with trio.open_nursery() as nursery:
            for k in range(connections * tasks):
                nursery.start_soon(worker, clients[k % connections])
    return took


def measure(daemon: Daemon, counts: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for label, connections, tasks in PASSES:
        n = counts[label]
        names = [f"c/{label.replace(' ', '')}/{uuid.uuid4().hex[:8]}-{i:06d}" for i in range(n)]
        before, cpu = daemon.tier2_requests(), daemon.cpu_seconds()
        started = time.monotonic()
        took = trio.run(creates, daemon.address, names, connections, tasks)
        seconds = time.monotonic() - started
        cpu = daemon.cpu_seconds() - cpu
        after = daemon.tier2_requests()
        requests = {op: round((after.get(op, 0) - before.get(op, 0)) / n, 3)
                    for op in sorted(after) if after.get(op, 0) != before.get(op, 0)}  # fmt: skip
        q = statistics.quantiles(took, n=100)
        row = {
            "pass": label,
            "creates": n,
            "seconds": round(seconds, 2),
            "creates_per_s": round(n / seconds, 1),
            "p50_ms": round(q[49] * 1000, 2),
            "p99_ms": round(q[98] * 1000, 2),
            "cpu_ms_per_create": round(cpu * 1000 / n, 3),
            "tier2_requests_per_create": requests,
        }
        log(f"  {label}: {row['creates_per_s']:,.0f}/s, p50 {row['p50_ms']} ms, "
            f"p99 {row['p99_ms']} ms, {row['cpu_ms_per_create']} ms CPU, {requests}")  # fmt: skip
        out.append(row)
    return out


def run_variant(
    work: pathlib.Path,
    s3: Any,
    env: dict[str, str],
    name: str,
    source: pathlib.Path,
    claims: bool,
    concurrency: int,
    counts: dict[str, int],
) -> dict[str, Any]:
    log(f"{name} ({'claims' if claims else 'embedded: no claims'}, code from {source}) ...")
    with contextlib.ExitStack() as stack:
        if claims:
            bucket, _ = stack.enter_context(bucket_of_its_own(s3, name.replace("_", "-")))
            tier2 = f'url = "s3://{bucket}/gw"\nendpoint_url = "{s3.endpoint_url}"'
        else:
            tier2 = 'url = "embedded"'
        daemon = Daemon(work, name, config(name, tier2, concurrency), env, mount=False)
        old_root, scale.ROOT = scale.ROOT, source  # the daemon's working directory
        try:
            daemon.start()
        finally:
            scale.ROOT = old_root
        try:
            passes = measure(daemon, counts)
        finally:
            daemon.stop()
    return {"variant": name, "claims": claims, "source": str(source),
            "tier2_concurrency": concurrency, "passes": passes}  # fmt: skip


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        TABLE_START,
        "",
        f"Create cost ({result['when']}, {result['machine']}; SeaweedFS on the same machine; "
        "`python bench/create_cost.py`). A create in a cluster claims its name "
        "(one conditional PUT); `embedded` claims nothing; `before`: the code before "
        "pipelined creates shared group commits; the number: `tier2.max_concurrency` "
        "(same run):",
        "",
        "| variant | in flight | creates/s | p50 ms | p99 ms | daemon CPU ms / create "
        "| Tier-2 requests / create |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for v in result["variants"]:
        for p in v["passes"]:
            req = ", ".join(f"{op} {n:g}" for op, n in p["tier2_requests_per_create"].items())
            lines.append(
                f"| {v['variant']} | {p['pass']} | {p['creates_per_s']:,.0f} | {p['p50_ms']:g} "
                f"| {p['p99_ms']:g} | {p['cpu_ms_per_create']:g} | {req or 'none'} |"
            )
    lines += ["", TABLE_END]
    return lines


def main() -> int:
    parser = argument_parser(__doc__, repeat=None, quick_help="fewer creates per pass")
    parser.add_argument(
        "--base", type=pathlib.Path, help="also run the variants from this checkout (code before)"
    )
    parser.add_argument("--tier2-concurrency", type=int, nargs="+", default=[8],
                        help="tier2.max_concurrency, one set of claiming variants each "
                        "(default 8, the default)")  # fmt: skip
    parser.add_argument("--no-embedded", action="store_true", help="skip the embedded baseline")
    args = parser.parse_args()
    counts = {"1 in flight": 500, "64 in flight": 3000, "4 x 64": 6000}
    if args.quick:
        counts = {k: v // 5 for k, v in counts.items()}
    stop_on_signals()
    from gateway.embedded import EmbeddedS3

    result: dict[str, Any] = {**result_header("create_cost"), "counts": counts,
                              "tier2_concurrency": args.tier2_concurrency}  # fmt: skip
    with work_directory(args.dir, "create-cost-") as work:
        s3 = EmbeddedS3(work / "s3")
        s3.start()
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        variants = []
        try:
            sources = [("this", ROOT)] + ([("before", args.base.resolve())] if args.base else [])
            for concurrency in args.tier2_concurrency:
                for tag, source in sources:
                    name = f"claims_{tag}_{concurrency}"
                    variants.append(run_variant(work, s3, env, name, source, True, concurrency,
                                                counts))  # fmt: skip
            if not args.no_embedded:
                variants.append(run_variant(work, s3, env, "embedded", ROOT, False,
                                            args.tier2_concurrency[0], counts))  # fmt: skip
        finally:
            s3.stop()
    result["variants"] = variants
    print_result(result)
    if args.write_table:
        replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
