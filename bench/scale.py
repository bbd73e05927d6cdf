#!/usr/bin/env python3
"""Scale benchmark: the baseline of issue 33 (months at scale), before its changes.

One SeaweedFS (`gateway.embedded.EmbeddedS3`) and real gateway daemons on
buckets of their own, each with its mount in the work directory. Two parts:

- **Trickle**: N segments (--trickle-segments, default 1,000) each getting
  one small event (a 63-byte line) a second for --trickle-seconds (default
  180), ``tier2.flush_interval = "1s"``, so each segment is flushed many
  times; two nodes at the same time (the same load), each on a bucket of
  its own, with ``tier2.defrag`` off and on (``defrag_min_chunks`` 8,
  ``defrag_interval`` 10 s, ``gc_grace`` 5 s; see scale_trickle.py), then
  every segment sealed. Measured: the chunks named per segment every 30 s
  during the trickle; the node's Tier-2 requests by operation over the
  trickle (its /metrics, ``segment_gateway_tier2_requests``; also as S3
  requests, a concat counted as the GETs and PUT it makes) extrapolated to
  an hour; the optimizer's bytes rewritten per byte written; and, once the
  last flushes, merges and deletions are done, the chunk objects under the
  node's ``chunks/`` prefix per segment (listed with boto3), active and
  then sealed. Then (unless --trickle-skip-cold), alone, the defrag-off
  node's sealed segments are read cold -- a Spark
  ``read.text(<mount>/fleet).count()`` (``local[2]``, median of
  --spark-repeat) and every segment through the mount (Python reads, one
  file after another), each with the node started on an empty cache
  directory and the page cache dropped --; the node is started again with
  defrag on and packs them (the optimizer looks at every segment after a
  start), and they are read cold again: before and after, the same bytes.
- **Scale**: for 10^3, 10^4 and 10^5 segments (10^6 with --million), a
  fresh node gets that many segments as fast as one client allows (create,
  one 100-byte append, seal, pipelined over 64 tasks; 1% left active),
  then waits until everything is in Tier 2. A tenth of the names sit at the
  mount's root, the rest in ``big/``. Measured: daemon RSS (``/proc``);
  one checkpoint (checkpoints are due every ``journal.checkpoint_every_frames``
  = 300 frames and are not timed by the daemon: 400 appends one at a time
  on an active segment, each its own frame, so at least one checkpoint
  falls among them; its cost on the event loop shows as the longest append
  stall over the median; its bytes from ``journal-dump`` after the stop);
  the newest whole metadata snapshot's bytes in Tier 2 and the newest
  delta's (``tier2.snapshot_interval = "5s"``; after the appends, only
  the active segment changed); time to stop and to start again until
  ready; after the start, ``ls`` (``ls -1``, i.e. sorted, as a user runs it) of the mount's root and
  of ``big/``, cold then again, and ``stat`` of one segment; then a second
  daemon on the same bucket (a follower, default ``cluster.refresh_interval``
  0.5 s): how long it takes to show all the first node's segments, and, in
  steady state over --follow-seconds (default 30), the first node's CPU
  (``/proc/PID/stat``) against the same window before the follower
  started, and the traffic on the first node's protocol port (``ss -ti``
  of its accepted connections: bytes each way and data segments in, about
  one per request for small requests), and the follower's own count of the
  requests it sent (``cluster_follow_requests_total``): for its first sync
  (pages of the walk over the first node's records) and per second in the
  steady state (change-feed pages).

Every step's time is logged; a step that fails is recorded (as a finding)
and the rest of that size is skipped. Prints one JSON document (progress on
stderr); --write-table rewrites the trickle's and the scale part's tables
in docs/PERFORMANCE.md (--skip-trickle, --skip-scale: only the other's).
--quick: 100 trickle segments for 60 s, one Spark count each, sizes 10^3 and
10^4, 10 s windows.
"""

from __future__ import annotations

import os
import pathlib
import re
import statistics
import subprocess
import sys
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
    argument_parser,
    log,
    print_result,
    replace_table,
    result_header,
    stop_on_signals,
    work_directory,
)
from scale_nodes import (  # noqa: E402
    CHECKPOINT_APPENDS,
    SETTLE_TIMEOUT,
    TABLE_END,
    TABLE_START,
    TRICKLE_END,
    TRICKLE_START,
    Daemon,
    bucket_of_its_own,
    create_all,
    flushed,
    node_config,
    objects,
    timed,
    wait_for,
)
from scale_trickle import (  # noqa: E402
    checkpoint_frames,
    one_at_a_time,
    run_trickle,
    trickle_table,
)


def scale_names(n: int) -> list[str]:
    at_root = max(1, n // 10)
    return [f"r{i:07d}" for i in range(at_root)] + [f"big/s{i:07d}" for i in range(n - at_root)]


def timed_ls(path: pathlib.Path) -> tuple[float, int]:
    t = time.monotonic()
    r = subprocess.run(["ls", "-1", str(path)], capture_output=True, check=True, timeout=900)
    return time.monotonic() - t, r.stdout.count(b"\n")


def timed_stat(path: pathlib.Path) -> float:
    t = time.monotonic()
    os.stat(path)
    return time.monotonic() - t


def served_traffic(port: int) -> dict[str, int]:
    """Bytes and TCP segments over the connections accepted on ``port`` (``ss -ti``)."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    got = {"bytes_sent": 0, "bytes_received": 0, "data_segs_in": 0, "connections": 0}
    for line in out.splitlines():
        if f":{port} " in line:
            got["connections"] += 1
        for key in ("bytes_sent", "bytes_received", "data_segs_in"):
            m = re.search(rf"\b{key}:(\d+)", line)
            if m:
                got[key] += int(m.group(1))
    return got


def window(node: Daemon, seconds: float) -> dict[str, float]:
    """``node``'s CPU share, and what its protocol port sent and got per second."""
    port = int(node.address.rpartition(":")[2])
    c0 = node.cpu_seconds()
    t0 = served_traffic(port)
    time.sleep(seconds)
    c1 = node.cpu_seconds()
    t1 = served_traffic(port)
    per_s = {f"{k}_per_s": (t1[k] - t0[k]) / seconds for k in t0 if k != "connections"}
    return {"cpu_share": (c1 - c0) / seconds, "connections": t1["connections"], **per_s}


def bulk_install(node: Daemon, n: int, steps: dict[str, float]) -> list[str]:
    """Install ``n`` sealed, flushed segments on the stopped, empty ``node``
    (`tests.helpers.bulk`): a tenth (at most 10^5) members of the stream
    ``big``, 1% left active at the end; their names."""
    from tests.helpers import bulk

    members = min(n // 10, 100_000)
    config = node.dir / "gateway.toml"
    config.write_text(node.config_text.replace("@CACHE@", str(node.dir / "cache0")))
    t = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "tests.helpers.bulk", "--config", str(config),
         "--data-dir", str(node.dir / "data"), "--segments", str(n), "--stream", "big",
         "--members", str(members), "--active", str(max(1, n // 100))],
        cwd=ROOT, env={**os.environ, **node.env}, check=True, timeout=SETTLE_TIMEOUT,
        stdout=sys.stderr,
    )  # fmt: skip
    steps["bulk_install_s"] = round(time.monotonic() - t, 2)
    log(f"{n}: installed in {steps['bulk_install_s']:.1f} s")
    return bulk.names(n, "big", members)


def make_segments(node: Daemon, names: list[str], active: int, budget: float,
                  out: dict[str, Any]) -> None:  # fmt: skip
    """Create, append to and seal ``names`` through the protocol (all but ``active``)."""
    n = len(names)
    steps = out["steps"]
    payload = b"x" * 99 + b"\n"
    t = time.monotonic()
    passes_s: dict[str, float] = {}
    out["passes_s"] = passes_s
    passes = timed(f"{n}: create, append, seal", steps)(
        lambda: trio.run(
            create_all, node.address, names, payload, lambda i: i >= active, budget, passes_s
        )
    )
    took = time.monotonic() - t
    if passes < 3:
        raise RuntimeError(
            f"creating {n:,} segments did not finish within the {budget:.0f} s budget "
            f"(stopped in pass {passes + 1} of 3: create, append, seal)"
        )
    out["segments_per_s"] = n / took


def run_scale(work: pathlib.Path, s3: Any, env: dict[str, str], n: int,
              follow_seconds: float, budget: float, tier2: str,
              bulk: bool = False) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"segments": n, "steps": {}}
    steps = out["steps"]
    names = scale_names(n)
    active = max(1, n // 100)
    with bucket_of_its_own(s3, f"s{n}") as (bucket, s3c):
        node_id = "node-s"
        config = node_config(node_id, bucket, s3.endpoint_url, 'snapshot_interval = "5s"\n' + tier2)
        node = Daemon(work / f"scale{n}", node_id, config, env)
        follower = Daemon(work / f"scale{n}", "node-f",
                          node_config("node-f", bucket, s3.endpoint_url, ""), env,
                          mount=False)  # fmt: skip
        try:
            if bulk:
                names = bulk_install(node, n, steps)
                steps["first_start_s"] = round(node.start(), 2)
                active_name = names[-1]
            else:
                steps["first_start_s"] = round(node.start(), 2)
                make_segments(node, names, active, budget, out)
                active_name = names[0]
            steps["flushed_wait_s"] = round(wait_for(lambda: flushed(node), "flushed"), 2)
            out["rss_mib_loaded"] = node.rss_mib()
            log(f"{n}: RSS {out['rss_mib_loaded']:.0f} MiB")
            lat = timed(f"{n}: {CHECKPOINT_APPENDS} appends one at a time", steps)(
                lambda: trio.run(one_at_a_time, node.address, active_name, CHECKPOINT_APPENDS)
            )
            med = statistics.median(lat)
            out["checkpoint_stall"] = {
                "append_p50_ms": med * 1e3, "append_max_ms": max(lat) * 1e3,
                "stall_ms": (max(lat) - med) * 1e3,
                "appends_over_10x_p50": sum(x > 10 * med for x in lat),
            }  # fmt: skip
            time.sleep(6)  # a snapshot after the last flush (snapshot_interval 5 s)
            snaps = sorted(objects(s3c, bucket, f"gw/{node_id}/meta/"), key=lambda o: o["Key"])
            wholes = [o for o in snaps if o["Key"].endswith(".snapshot")]
            deltas = [o for o in snaps if o["Key"].endswith(".delta")]
            out["snapshot_bytes"] = wholes[-1]["Size"] if wholes else None
            # What each later upload costs while few segments change (the
            # active one here): a delta of the whole one.
            out["snapshot_delta_bytes"] = deltas[-1]["Size"] if deltas else None
            out["chunk_objects"] = len(objects(s3c, bucket, f"gw/{node_id}/chunks/"))
            steps["stop_s"] = round(node.stop(), 2)
            sizes = timed(f"{n}: journal-dump", steps)(
                lambda: checkpoint_frames(node.dir / "data" / "journal")
            )
            out["checkpoints_in_journal"] = len(sizes)
            out["checkpoint_bytes"] = sizes[-1] if sizes else None
            out["startup_s"] = round(node.start(), 2)
            steps["startup_s"] = out["startup_s"]
            log(f"{n}: startup {out['startup_s']:.1f} s")
            out["rss_mib_restarted"] = node.rss_mib()
            assert node.mountpoint is not None
            one = node.mountpoint / names[-1]
            out["stat_s"] = {"cold": timed_stat(one), "again": timed_stat(one)}
            ls: dict[str, Any] = {}
            for label, path in (("root", node.mountpoint), ("big", node.mountpoint / "big")):
                cold, entries = timed_ls(path)
                warm, _ = timed_ls(path)
                ls[label] = {"entries": entries, "cold_s": cold, "again_s": warm}
            out["ls"] = ls
            log(f"{n}: ls {ls}, stat {out['stat_s']}")
            out["rss_mib_after_ls"] = node.rss_mib()
            # The follower.
            idle = window(node, follow_seconds)
            steps["follower_start_s"] = round(follower.start(), 2)
            key = f'segment_gateway_cluster_remote_segments{{node="{node_id}",tail_available="1"}}'

            def sees_all() -> bool:
                m = follower.metrics()
                return m.get(key, 0) + m.get(key.replace('"1"', '"0"'), 0) >= n

            t = time.monotonic()
            steps["follower_sees_all_s"] = round(wait_for(sees_all, "the follower sees all"), 2)
            out["follower_sees_all_s"] = time.monotonic() - t + steps["follower_start_s"]
            first_sync = follow_requests(follower, node_id)
            followed = window(node, follow_seconds)
            fcpu0 = follower.cpu_seconds()
            time.sleep(1)
            fcpu1 = follower.cpu_seconds()
            steady = follow_requests(follower, node_id)
            out["follow"] = {
                "window_s": follow_seconds,
                "leader_idle": idle,
                "leader_followed": followed,
                "leader_cpu_share_added": followed["cpu_share"] - idle["cpu_share"],
                "follower_cpu_share": fcpu1 - fcpu0,
                "follower_rss_mib": follower.rss_mib(),
                "first_sync_requests": first_sync,
                "requests_per_s": {
                    k: (steady[k] - first_sync[k]) / (follow_seconds + 1) for k in steady
                },
            }
            log(f"{n}: follow {out['follow']}")
        except Exception as e:
            out.setdefault("failures", []).append(f"{type(e).__name__}: {e}")
            out["traceback"] = traceback.format_exception(e)[-8:]
            out["daemon_tail"] = node.tail().splitlines()
            log(f"{n} FAILED: {e}")
        finally:
            follower.stop()
            node.stop()
    return out


# -- the report -------------------------------------------------------------------------


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}; one run, "
        "today's code (the baseline before issue 33's changes); SeaweedFS on loopback.",
        "",
    ]
    runs = result["scale"]
    head = "| measure | " + " | ".join(f"{r['segments']:,}" for r in runs) + " |"
    lines += [
        "Scale: segments created (one 100-byte append, 99% sealed), all flushed; "
        "a tenth at the mount's root, the rest in `big/`.",
        "",
        head,
        "|---|" + "---|" * len(runs),
    ]

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> None:
        cells = []
        for r in runs:
            try:
                cells.append(get(r))
            except (KeyError, TypeError):
                cells.append("failed" if r.get("failures") else "—")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("segments made/s (create, append, seal passes; 64 in flight)",
        lambda r: f"{r['segments_per_s']:,.0f}")  # fmt: skip
    row("creates/s (the create pass alone)",
        lambda r: f"{r['segments'] / r['passes_s']['created']:,.0f}")  # fmt: skip
    row("wait until all flushed, s", lambda r: f"{r['steps']['flushed_wait_s']:.1f}")
    row("daemon RSS loaded / after restart, MiB",
        lambda r: f"{r['rss_mib_loaded']:.0f} / {r['rss_mib_restarted']:.0f}")  # fmt: skip
    row("startup to ready, s", lambda r: f"{r['startup_s']:.1f}")
    row("stop (SIGTERM to exit), s", lambda r: f"{r['steps']['stop_s']:.1f}")
    row("checkpoint bytes (last in the journal)", lambda r: f"{r['checkpoint_bytes']:,}")
    row("checkpoint stall: longest append − median, ms",
        lambda r: f"{r['checkpoint_stall']['stall_ms']:.0f} "
        f"(p50 {r['checkpoint_stall']['append_p50_ms']:.1f})")  # fmt: skip
    row("Tier-2 snapshot bytes: whole / delta (1 segment changed)",
        lambda r: f"{r['snapshot_bytes']:,} / {r.get('snapshot_delta_bytes') or 0:,}")  # fmt: skip
    row("`ls` root: entries, cold / again s",
        lambda r: f"{r['ls']['root']['entries']:,}: {r['ls']['root']['cold_s']:.2f} / "
        f"{r['ls']['root']['again_s']:.2f}")  # fmt: skip
    row("`ls big/`: entries, cold / again s",
        lambda r: f"{r['ls']['big']['entries']:,}: {r['ls']['big']['cold_s']:.2f} / "
        f"{r['ls']['big']['again_s']:.2f}")  # fmt: skip
    row(
        "`stat` one segment, cold / again ms",
        lambda r: f"{r['stat_s']['cold'] * 1e3:.1f} / {r['stat_s']['again'] * 1e3:.2f}",
    )
    row("follower: start → shows all, s", lambda r: f"{r['follower_sees_all_s']:.1f}")
    row(
        "follower: leader CPU added (share of a core)",
        lambda r: f"{r['follow']['leader_cpu_share_added']:.2f}",
    )
    row("follower: leader's port, data segments in/s (≈ requests/s)",
        lambda r: f"{r['follow']['leader_followed']['data_segs_in_per_s']:.1f}")  # fmt: skip
    row("follower: leader's port, kB/s out / in",
        lambda r: f"{r['follow']['leader_followed']['bytes_sent_per_s'] / 1e3:,.1f} / "
        f"{r['follow']['leader_followed']['bytes_received_per_s'] / 1e3:,.1f}")  # fmt: skip
    row("follower: its own CPU (share of a core) / RSS MiB",
        lambda r: f"{r['follow']['follower_cpu_share']:.2f} / "
        f"{r['follow']['follower_rss_mib']:.0f}")  # fmt: skip
    row("follower: first sync, requests (walk pages + listings + records)",
        lambda r: "{walk:.0f} + {list:.0f} + {get_record:.0f}".format(
            **r["follow"]["first_sync_requests"]))  # fmt: skip
    row("follower: steady state, requests/s (changes + walk + list)",
        lambda r: "{changes:.1f} + {walk:.1f} + {list:.1f}".format(
            **r["follow"]["requests_per_s"]))  # fmt: skip
    failures = [f"{r['segments']:,}: {'; '.join(r['failures'])}" for r in runs
                if r.get("failures")]  # fmt: skip
    if failures:
        lines += ["", "Failures: " + " / ".join(failures)]
    lines.append(TABLE_END)
    return lines


def follow_requests(follower: Daemon, node_id: str) -> dict[str, float]:
    """What the follower has asked of ``node_id`` so far, by kind (its own metrics)."""
    m = follower.metrics()
    out = {}
    for kind in ("walk", "list", "get_record", "changes"):
        labels = f'kind="{kind}",node="{node_id}"'
        out[kind] = m.get(f"segment_gateway_cluster_follow_requests_total{{{labels}}}", 0.0)
    return out


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where the daemons and SeaweedFS write (default: .bench-tmp)",
        repeat=None,
        quick_help="smoke test: 100 trickle segments for 60 s, sizes 10^3 and 10^4",
    )
    parser.add_argument("--trickle-segments", type=int, default=1000)
    parser.add_argument("--trickle-seconds", type=float, default=180.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--million", action="store_true", help="also 10^6 segments")
    parser.add_argument("--follow-seconds", type=float, default=30.0)
    parser.add_argument("--skip-trickle", action="store_true")
    parser.add_argument("--trickle-skip-cold", action="store_true",
                        help="no cold reads before and after packing the trickle")  # fmt: skip
    parser.add_argument(
        "--skip-scale",
        action="store_true",
        help="the trickle part only (--write-table then rewrites its table only)",
    )
    parser.add_argument(
        "--spark-repeat",
        type=int,
        default=3,
        help="cold Spark counts before and after defragmentation (median)",
    )
    parser.add_argument("--bulk", action="store_true",
                        help="install each size's segments (tests/helpers/bulk.py: "
                        "sealed, flushed, one shared chunk), not one by one")  # fmt: skip
    parser.add_argument("--create-budget", type=float, default=1500.0,
                        help="seconds each size may spend creating (default 1500)")  # fmt: skip
    parser.add_argument("--tier2-concurrency", type=int, default=32,
                        help="the loaded node's tier2.max_concurrency (default 32; "
                        "creates claim names and seals flush: Tier-2 bound)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.trickle_segments, args.trickle_seconds = 100, 60.0
        args.sizes, args.follow_seconds = [1000, 10_000], 10.0
        args.spark_repeat = 1
    if args.million:
        args.sizes = [*args.sizes, 1_000_000]
    stop_on_signals()
    from gateway.embedded import EmbeddedS3

    began = time.monotonic()
    result: dict[str, Any] = {**result_header("scale"), "quick": bool(args.quick)}
    with work_directory(args.dir, "scale-") as work:
        s3 = EmbeddedS3(work / "s3")
        s3.start()
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        try:
            if not args.skip_trickle:
                result["trickle"] = run_trickle(work, s3, env, args.trickle_segments,
                                                args.trickle_seconds, args.spark_repeat,
                                                not args.trickle_skip_cold)  # fmt: skip
            else:
                result["trickle"] = {"failures": ["skipped"]}
            result["scale"] = []
            for n in [] if args.skip_scale else args.sizes:
                t = time.monotonic()
                r = run_scale(work, s3, env, n, args.follow_seconds, args.create_budget,
                              f"max_concurrency = {args.tier2_concurrency}",
                              args.bulk)  # fmt: skip
                r["total_s"] = time.monotonic() - t
                log(f"{n}: done in {r['total_s']:.0f} s")
                result["scale"].append(r)
        finally:
            s3.stop()
    result["total_s"] = time.monotonic() - began
    print_result(result)
    if args.write_table:
        if not args.skip_trickle:
            replace_table(args.write_table, TRICKLE_START, TRICKLE_END, trickle_table(result))
        if not args.skip_scale:
            replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    failed = result["trickle"].get("failures") or any(r.get("failures") for r in result["scale"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
