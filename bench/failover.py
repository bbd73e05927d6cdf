#!/usr/bin/env python3
"""Failover benchmark: a dead node's segments taking appends again, against restarting it.

One SeaweedFS (`gateway.embedded.EmbeddedS3`) and, per scenario, three fresh
gateway daemons (node-a, node-b, node-c, each with its own data directory
and loopback ports) on a bucket of their own, replicating their journals
(``write_quorum = 3, ack_quorum = 2``, ``ack_timeout = "3s"``,
``peer_timeout = "1s"``) with short cluster timers (``heartbeat_interval =
"0.5s"``, ``down_after = "3s"``, ``lease = "2s"``, ``refresh_interval =
"0.25s"``, as the tests' cluster uses). Tier 2 never flushes during a run
(``flush_interval = "24h"``, 5 GiB chunks), so everything loaded stays in
the journals.

Before each scenario the victim, node-c, is loaded over the protocol: 1,000
segments (--segments) holding 256 MiB (--mib) together, appended with 16
appends in flight, all unflushed. Then an exactly-once writer
(`gateway.client.writer.open_segment_writer`, ``lines`` codec, homed on
node-a) appends to one more of node-c's segments, flushing every 10 events
and recording when each flush is acknowledged, and after a second of that:

- **takeover** (``cluster.takeover = true``): node-c gets SIGKILL; a
  survivor runs its container (`gateway.cluster.failover`). Measured: kill
  -> the first acknowledged flush, and the writer's longest pause.
- **drain** (``cluster.takeover = true``): ``segment-gateway cluster drain
  node-c --to node-b`` (`gateway.cli.cluster`). Measured: the longest pause
  between acknowledgements, the command's total time; the drained node must
  exit 0.
- **restart in place** (the baseline, ``cluster.takeover = false``): node-c
  gets SIGKILL and is started again at once on the same data directory and
  port, as a supervisor would. Measured as for takeover.

After each scenario every acknowledged byte is read back over the protocol
through node-a (the 1,000 segments byte for byte, the writer's segment
event for event: each once, in order); any difference is a failure, listed
in the JSON's ``failures`` (and the exit status is 1). Lines the daemons
logged about takeover, recovery and drain (a hosted process's lines come
prefixed ``[node-c on node-x]`` in its host's log) are kept in each run.

Targets (issue 32): takeover <= down_after + 10 s; drain pause <= 2 s.
Medians of --repeat runs, each run all three scenarios, the order
alternating. One run at full size takes 4 to 7 minutes on two cores
(loading node-c three times, the pauses themselves and reading everything
back are most of it), so the default is one run; the table in
docs/PERFORMANCE.md is from --repeat 3 (13 to 19 minutes). Prints one JSON document (progress on
stderr); --write-table rewrites the section of docs/PERFORMANCE.md.
--quick: one run with 100 segments and 16 MiB (a smoke test, about a
minute). The exit status is 1 if any scenario failed or lost data.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import trio

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    argument_parser,
    log,
    met,
    print_result,
    replace_table,
    result_header,
    stop_on_signals,
    work_directory,
)
from replication import Node, replication_settled, wait_until  # noqa: E402

from gateway.client.client import ResponseFuture, open_client  # noqa: E402
from gateway.client.writer import open_segment_writer  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
NODES = ("node-a", "node-b", "node-c")
VICTIM, HOME, DRAIN_TO = "node-c", "node-a", "node-b"
HEARTBEAT, DOWN_AFTER, LEASE, REFRESH = 0.5, 3.0, 2.0, 0.25
TARGET_TAKEOVER = DOWN_AFTER + 10.0
TARGET_DRAIN_PAUSE = 2.0
INFLIGHT = 16
#: Connections reading everything back after a scenario.
CHECKERS = 8
#: Tries of each read-back before it counts as a failure.
READ_TRIES = 5
#: The writer: a flush every this many events, then a short sleep.
FLUSH_EVERY, FLUSH_SLEEP = 10, 0.005
#: How long the writer runs before the event, and after its first ack after it.
WARMUP, SETTLE = 1.0, 1.0
#: Give up on a scenario's writer this long after the event.
GIVE_UP = 180.0
WRITER_SEGMENT = "bench/writer"
SCENARIOS = ("takeover", "drain", "restart")
LOG_PATTERN = re.compile(
    r"failover|took over|takeover|recover|handover|handback|drain|hosted|fenced|epoch|"
    r"ERROR|Traceback|\[node-c on"
)
TABLE_START = "<!-- bench/failover.py:start -->"
TABLE_END = "<!-- bench/failover.py:end -->"


# -- the daemons --------------------------------------------------------------------


def node_config(node: str, bucket: str, endpoint: str, takeover: bool) -> str:
    """A replicating node with short cluster timers; Tier 2 never flushes during a run."""
    return f"""
[node]
id = "{node}"
[container]
max_append_bytes = "8 MiB"
[cache]
budget = "2 GiB"
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
flush_interval = "24h"
flush_size = "5 GiB"
max_chunk_size = "5 GiB"
snapshot_interval = 0
retry_deadline = "5s"
[cluster]
heartbeat_interval = "{HEARTBEAT:g}s"
down_after = "{DOWN_AFTER:g}s"
refresh_interval = "{REFRESH:g}s"
lease = "{LEASE:g}s"
takeover = {"true" if takeover else "false"}
[replication]
write_quorum = 3
ack_quorum = 2
ack_timeout = "3s"
peer_timeout = "1s"
[journal]
preallocate_step = "1 MiB"
"""


@contextlib.contextmanager
def running_cluster(
    work: pathlib.Path, s3: Any, tag: str, takeover: bool
) -> Iterator[dict[str, Node]]:
    """Three fresh daemons on a bucket of their own, node-c's ensemble full; removed after."""
    from gateway.storage.s3 import S3Storage

    root = work / tag
    bucket = f"bench-fo-{uuid.uuid4().hex[:8]}"
    storage = S3Storage(bucket, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                        secret_key=s3.secret_key)  # fmt: skip
    storage.create_bucket_if_missing()
    storage.close()
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    nodes = {n: Node(root, n, node_config(n, bucket, s3.endpoint_url, takeover), env)
             for n in NODES}  # fmt: skip
    try:
        for n in nodes.values():
            n.start()
        for n in nodes.values():
            n.wait_ready()
        for node in nodes.values():
            wait_until(partial(replication_settled, node, 2), f"{node.name}'s ensemble full")
        yield nodes
    finally:
        # SIGKILL: a clean stop would flush the hundreds of MiB the cluster is
        # thrown away with. Hosted containers die with their host (their
        # parent-death signal is SIGKILL).
        for n in nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def daemon_lines(nodes: dict[str, Node], limit: int = 15) -> list[str]:
    """What the daemons logged about takeovers, recovery and drains (each its last ``limit``)."""
    lines = []
    for name, n in nodes.items():
        mine = []
        for path in (n.dir / "daemon.log.killed", n.log_path):
            if path.exists():
                mine += [f"{name}: {line}" for line in path.read_text(errors="replace").splitlines()
                         if LOG_PATTERN.search(line)]  # fmt: skip
        lines += mine[-limit:]
    return lines


# -- loading and checking -----------------------------------------------------------


def segment_names(segments: int) -> list[str]:
    return [f"bench/s{i:04d}" for i in range(segments)]


async def load(address: str, blob: bytes, segments: int) -> dict[str, float]:
    """Create ``segments`` segments and append ``blob`` across them; seconds each took."""
    names = segment_names(segments)
    size = len(blob) // segments
    started = time.monotonic()
    async with open_client(address) as client:
        async with trio.open_nursery() as nursery:
            todo = iter(names)

            async def creator() -> None:
                for name in todo:
                    await client.create(name)

            for _ in range(INFLIGHT):
                nursery.start_soon(creator)
        await client.create(WRITER_SEGMENT, codec="lines")
        created = time.monotonic()
        slots = trio.Semaphore(INFLIGHT)
        send, receive = trio.open_memory_channel[ResponseFuture](INFLIGHT)

        async def acknowledgements() -> None:
            async with receive:
                async for fut in receive:
                    await fut.wait()
                    slots.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledgements)
            async with send:
                for i, name in enumerate(names):
                    for off in range(0, size, MIB):
                        piece = blob[i * size + off : i * size + min(size, off + MIB)]
                        await slots.acquire()
                        await send.send(await client.start_append(name, piece))
    return {"create_s": created - started, "append_s": time.monotonic() - created}


def event(i: int) -> bytes:
    return b"event-%08d" % i


async def check(
    address: str, blob: bytes, segments: int, events: int, read_errors: list[str]
) -> list[str]:
    """What is missing or wrong, read back over the protocol from node-c's container.

    Through ``address``, which answers reads of another node's segments too.
    A read that fails is tried again (up to READ_TRIES times, a second
    apart) and its error kept in ``read_errors``: a failed read is not a
    loss, but it is reported.
    """
    problems: list[str] = []
    size = len(blob) // segments
    todo = iter(enumerate(segment_names(segments)))

    async def read_all(client: Any, name: str, length: int | None) -> tuple[int, bytes]:
        for attempt in range(READ_TRIES):
            try:
                info = await client.info(name)
                n = info.length if length is None else length
                got = (await client.read(name, 0, n)).data if info.length else b""
                return info.length, got
            except Exception as e:  # whatever it is, it is reported
                read_errors.append(f"{name} (try {attempt + 1}): {describe(e)}")
                if attempt == READ_TRIES - 1:
                    raise
                await trio.sleep(1.0)
        raise AssertionError("unreachable")

    async def reader() -> None:
        async with open_client(address) as client:
            for i, name in todo:
                want = blob[i * size : (i + 1) * size]
                length, got = await read_all(client, name, size)
                if length != size or got != want:
                    same = "equal" if got == want else "DIFFER"
                    problems.append(f"{name}: length {length}, {len(got)} bytes read, "
                                    f"want {size}, bytes {same}")  # fmt: skip

    async with trio.open_nursery() as nursery:
        for _ in range(CHECKERS):
            nursery.start_soon(reader)
    async with open_client(address) as client:
        _, data = await read_all(client, WRITER_SEGMENT, None)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    expected = [event(i) for i in range(events)]
    if lines != expected:
        missing = len(set(expected) - set(lines))
        extra = len(lines) - len(set(lines))
        problems.append(f"{WRITER_SEGMENT}: {len(lines)} events read, {events} acknowledged "
                        f"({missing} missing, {extra} duplicated, in order: "
                        f"{lines == sorted(lines)})")  # fmt: skip
    return problems


# -- the writer and the event -------------------------------------------------------


async def ride_through(home: str, action: Callable[[], Any], background: bool) -> dict[str, Any]:
    """An exactly-once writer homed on ``home``; ``action`` after WARMUP s of acks.

    ``action`` runs inline between two flushes (kill -9: the next flush starts
    after it), or, when ``background``, in a thread while the writer goes on.
    The writer stops SETTLE s after the first acknowledgement that follows
    the action's end. Returns the ack times (relative to the action's start),
    the action's result, and how many events were acknowledged.
    """
    acks: list[float] = []
    outcome: list[Any] = []
    done = trio.Event()
    t0 = t_done = 0.0

    async def in_thread() -> None:
        nonlocal t_done
        try:
            outcome.append(await trio.to_thread.run_sync(action))
        finally:
            t_done = time.monotonic()
            done.set()

    async with trio.open_nursery() as nursery, open_segment_writer(
        home, WRITER_SEGMENT, codec="lines", writer_id=uuid.uuid4().bytes,
        max_batch_bytes=2048, reconnect_timeout=GIVE_UP,
    ) as w:  # fmt: skip
        started = time.monotonic()
        with trio.fail_after(WARMUP + GIVE_UP + 60):
            for i in itertools.count():
                await w.write(event(i))
                if i % FLUSH_EVERY:
                    continue
                await w.flush()
                now = time.monotonic()
                acks.append(now)
                if not t0 and now - started >= WARMUP:
                    t0 = time.monotonic()
                    if background:
                        nursery.start_soon(in_thread)
                    else:
                        outcome.append(action())
                        t_done = time.monotonic()
                        done.set()
                elif done.is_set() and now > t_done:
                    after = [t for t in acks if t > t_done]
                    if after and now - after[0] >= SETTLE:
                        break
                await trio.sleep(FLUSH_SLEEP)
        await w.flush()
        events = w.acked_event
        stats = {"reconnects": w.reconnects, "duplicates": w.duplicates}
    return {"acks": [t - t0 for t in acks], "done_s": t_done - t0, "outcome": outcome,
            "events": events, **stats}  # fmt: skip


def pauses(acks: list[float]) -> dict[str, float]:
    """First ack after the event (t = 0) and the longest gap between acks."""
    return {
        "first_ack_s": min(t for t in acks if t > 0),
        "longest_pause_s": max(b - a for a, b in itertools.pairwise(acks)),
        "acks": len(acks),
    }


async def hosted_by(address: str, node: str) -> str:
    async with open_client(address) as client:
        status = {n.id: n for n in await client.cluster()}
    return status[node].hosted_by if node in status else "(not in the registry)"


# -- the scenarios ------------------------------------------------------------------


def scenario(
    name: str, work: pathlib.Path, s3: Any, blob: bytes, segments: int, rep: int,
    logs: pathlib.Path | None,
) -> dict[str, Any]:  # fmt: skip
    """One scenario on a fresh cluster: load node-c, ride through the event, check."""
    out: dict[str, Any] = {"scenario": name, "failures": []}
    with running_cluster(work, s3, f"r{rep}-{name}", takeover=name != "restart") as nodes:
        victim, home = nodes[VICTIM], nodes[HOME]
        try:
            out.update(trio.run(load, victim.address, blob, segments))
            log(f"rep {rep} {name}: node-c loaded: {segments} segments created in "
                f"{out['create_s']:.1f} s, {len(blob) / MIB:.0f} MiB appended in "
                f"{out['append_s']:.1f} s")  # fmt: skip

            if name == "takeover":

                def action() -> None:
                    assert victim.proc is not None
                    victim.proc.kill()

                r = trio.run(ride_through, home.address, action, False)
                out["hosted_by"] = trio.run(hosted_by, home.address, VICTIM)
            elif name == "restart":

                def action() -> None:
                    assert victim.proc is not None
                    victim.proc.kill()
                    victim.proc.wait()
                    victim.ready.unlink(missing_ok=True)
                    victim.log_path.rename(victim.dir / "daemon.log.killed")
                    victim.start()

                r = trio.run(ride_through, home.address, action, False)
            else:

                def drain() -> subprocess.CompletedProcess[str]:
                    return subprocess.run(
                        [sys.executable, "-m", "gateway.cli", "cluster", "drain", VICTIM,
                         "--to", DRAIN_TO, "--connect", home.address, "--timeout", "300"],
                        capture_output=True, text=True, timeout=360, cwd=ROOT,
                    )  # fmt: skip

                r = trio.run(ride_through, home.address, drain, True)
                cli = r["outcome"][0] if r["outcome"] else None
                out["drain_s"] = r["done_s"]
                out["drain_exit"] = cli.returncode if cli else None
                out["drain_output"] = cli.stderr.strip().splitlines()[-6:] if cli else []
                if not cli or cli.returncode != 0:
                    out["failures"].append(f"drain exited {out['drain_exit']}")
                assert victim.proc is not None
                try:
                    out["drained_exit"] = victim.proc.wait(60)
                except subprocess.TimeoutExpired:
                    out["drained_exit"] = None
                if out["drained_exit"] != 0:
                    out["failures"].append(f"the drained node exited {out['drained_exit']}")
                out["hosted_by"] = trio.run(hosted_by, home.address, VICTIM)
            out.update(pauses(r["acks"]))
            if name == "drain":
                del out["first_ack_s"]  # the writer never stops: its longest pause says it
            out.update(events=r["events"], reconnects=r["reconnects"],
                       duplicates=r["duplicates"])  # fmt: skip
            first = out.get("first_ack_s")
            log(f"rep {rep} {name}: "
                + (f"first ack {first:.2f} s after the event, " if first is not None else "")
                + f"longest pause {out['longest_pause_s']:.2f} s"
                + (f", drain {out['drain_s']:.1f} s" if name == "drain" else "")
                + (f", hosted by {out['hosted_by']}" if "hosted_by" in out else ""))  # fmt: skip
            checking = time.monotonic()
            read_errors: list[str] = []
            try:
                problems = trio.run(check, home.address, blob, segments, r["events"], read_errors)
            finally:
                if read_errors:
                    out["read_errors"] = read_errors[:20]
                    out["read_errors_total"] = len(read_errors)
            out["check_s"] = time.monotonic() - checking
            if problems:
                out["failures"].append(f"DATA LOSS: {len(problems)} segment(s) wrong")
                out["data_problems"] = problems[:20]
            out["checked"] = f"{segments} segments, {r['events']} writer events"
        except Exception as e:  # the scenario failed: say so, with what the daemons logged
            out["failures"].append(describe(e))
            out["traceback"] = traceback.format_exception(e)[-12:]
        if out["failures"]:
            log(f"rep {rep} {name}: FAILED: {'; '.join(out['failures'])}")
            for line in out.get("traceback", []):
                log(line.rstrip())
        out["daemon_log"] = daemon_lines(nodes)
        if logs is not None:
            keep = logs / f"r{rep}-{name}"
            keep.mkdir(parents=True, exist_ok=True)
            for n in nodes.values():
                for path in (n.dir / "daemon.log.killed", n.log_path):
                    if path.exists():
                        shutil.copy(path, keep / f"{n.name}-{path.name}")
    return out


def describe(e: BaseException) -> str:
    """An exception in one line; an exception group by what it holds."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


# -- the report ---------------------------------------------------------------------


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians per scenario, the ratios to restart in place, the targets."""
    med: dict[str, dict[str, float]] = {}
    for s in SCENARIOS:
        ok = [r[s] for r in runs if "longest_pause_s" in r.get(s, {})]
        keys = ["longest_pause_s", "create_s", "append_s"]
        keys += ["drain_s"] if s == "drain" else ["first_ack_s"]
        med[s] = {k: median([o[k] for o in ok]) for k in keys}
    failures = [f"rep {i} {s}: {f}" for i, r in enumerate(runs) for s in SCENARIOS
                for f in r.get(s, {}).get("failures", [])]  # fmt: skip
    take, drain, restart = med["takeover"], med["drain"], med["restart"]
    targets = {
        "takeover": {
            "target": f"kill -9 → first append on the dead node's segment ≤ down_after + 10 s "
            f"({TARGET_TAKEOVER:g} s)",
            "value_s": take["first_ack_s"],
            "met": take["first_ack_s"] <= TARGET_TAKEOVER,
        },
        "drain": {
            "target": f"drain: writer's longest pause ≤ {TARGET_DRAIN_PAUSE:g} s",
            "value_s": drain["longest_pause_s"],
            "met": drain["longest_pause_s"] <= TARGET_DRAIN_PAUSE,
        },
    }
    return {
        "medians": med,
        "takeover_vs_restart": take["first_ack_s"] / restart["first_ack_s"],
        "targets": targets,
        "failures": failures,
        "runs": runs,
    }


def table(result: dict[str, Any]) -> list[str]:
    m, t = result["medians"], result["targets"]

    def each(s: str, key: str) -> str:
        runs = [r.get(s, {}) for r in result["runs"]]
        return ", ".join(f"{r[key]:.1f}" if key in r else "failed" for r in runs)

    def row(label: str, s: str, first: str, extra: str = "") -> str:
        return (f"| {label} | {first} | {m[s]['longest_pause_s']:.1f} "
                f"({each(s, 'longest_pause_s')}) | {extra} |")  # fmt: skip

    failures = result["failures"]
    return [
        TABLE_START,
        f"Run {result['when']} on {result['machine']}, software {result['version']}; medians "
        f"of {result['repeat']} runs (each run's figure in brackets), node-c holding "
        f"{result['segments']:,} segments and {result['unflushed_mib']:.0f} MiB unflushed; "
        f"`down_after` {DOWN_AFTER:g} s, `lease` {LEASE:g} s, `heartbeat_interval` "
        f"{HEARTBEAT:g} s, `write_quorum = 3, ack_quorum = 2`.",
        "",
        "| node-c … | kill -9 → first ack on its segment, s | writer's longest pause, s "
        "| |",
        "|---|---|---|---|",
        row("killed, taken over by a survivor (`takeover = true`)", "takeover",
            f"{m['takeover']['first_ack_s']:.1f} ({each('takeover', 'first_ack_s')})",
            f"{result['takeover_vs_restart']:.2f}× restart in place"),
        row("drained to node-b (`cluster drain node-c --to node-b`)", "drain", "—",
            f"drain took {m['drain']['drain_s']:.1f} s ({each('drain', 'drain_s')})"),
        row("killed and restarted in place at once (baseline, `takeover = false`)", "restart",
            f"{m['restart']['first_ack_s']:.1f} ({each('restart', 'first_ack_s')})"),
        "",
        "Targets: "
        + "; ".join(f"{v['target']} — {v['value_s']:.2f} s ({met(v['met'])})" for v in t.values())
        + ". Every acknowledged byte and event read back after each scenario: "
        + ("all there." if not failures else f"**FAILURES: {'; '.join(failures)}**"),
        TABLE_END,
    ]  # fmt: skip


def main() -> int:
    parser = argument_parser(
        __doc__,
        work_dir_help="where the daemons and SeaweedFS write (default: .bench-tmp)",
        repeat=1,
        repeat_help="runs of the three scenarios (default 1: 4 to 7 minutes each)",
        quick_help="smoke test: one run, 100 segments, 16 MiB",
    )
    parser.add_argument("--segments", type=int, default=1000,
                        help="node-c's segments (default 1000)")  # fmt: skip
    parser.add_argument("--mib", type=int, default=256,
                        help="MiB unflushed on node-c, in its segments (default 256)")  # fmt: skip
    parser.add_argument(
        "--logs",
        type=pathlib.Path,
        metavar="DIR",
        help="keep every daemon's log here (DIR/rN-SCENARIO/NODE-daemon.log)",
    )
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="run only these (the report needs all three)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.segments, args.mib = 1, 100, 16
    stop_on_signals()
    from gateway.embedded import EmbeddedS3

    blob = os.urandom(args.mib * MIB // args.segments * args.segments)
    runs: list[dict[str, dict[str, Any]]] = []
    began = time.monotonic()
    with work_directory(args.dir, "failover-") as work:
        s3 = EmbeddedS3(work / "s3")
        s3.start()
        try:
            for rep in range(args.repeat):
                order = SCENARIOS if rep % 2 == 0 else tuple(reversed(SCENARIOS))
                run = {s: scenario(s, work, s3, blob, args.segments, rep, args.logs)
                       for s in order if s in args.scenarios}  # fmt: skip
                runs.append({s: run[s] for s in SCENARIOS if s in run})
        finally:
            s3.stop()
    result = {
        **result_header("failover"),
        "segments": args.segments,
        "unflushed_mib": len(blob) / MIB,
        "unflushed_bytes": len(blob),
        "repeat": args.repeat,
        "cluster": {"heartbeat_interval_s": HEARTBEAT, "down_after_s": DOWN_AFTER,
                    "lease_s": LEASE, "refresh_interval_s": REFRESH,
                    "write_quorum": 3, "ack_quorum": 2, "flush_interval": "24h"},
        "writer": {"flush_every_events": FLUSH_EVERY, "sleep_s": FLUSH_SLEEP,
                   "warmup_s": WARMUP, "settle_s": SETTLE, "homed_on": HOME},
        "total_s": time.monotonic() - began,
        **summarize(runs),
    }  # fmt: skip
    print_result(result)
    if result["failures"]:
        log("FAILURES (see the JSON's failures and each run's daemon_log):")
        for f in result["failures"]:
            log(f"  {f}")
    if args.write_table:
        replace_table(args.write_table, TABLE_START, TABLE_END, table(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
