"""The torture loop in cluster mode: three nodes on one bucket, faults at random.

Three real daemons with their mounts share one bucket of a SeaweedFS that
this test runs itself (it kills and stops it; the session's ``seaweedfs``
fixture must not be touched). Each node owns one segment, written by an
exactly-once `SegmentWriter` (lines codec) that connects through *another*
node, so every write starts with a NOT_OWNER redirect and every owner
failure sends the writer back through that node (OWNER_DOWN while the
owner is down). Readers follow every segment through every node, over the
protocol and through the mount; what any of them sees must always be a
prefix of its writer's lines -- never a wrong line, never one twice.

Rounds of a few seconds; in every round one fault at random (a seeded RNG,
each kind at least once, in a random order), now and then a second one:

- ``kill_node``: SIGKILL a node, restart it in place (same data, port, mount);
- ``stop_node``: SIGSTOP a node for 1-4 s (alive, silent), then SIGCONT;
- ``kill_s3``: SIGKILL SeaweedFS, restart it on the same ports and data
  (every node loses Tier 2: leases run out, appends wait in the writers);
- ``stop_s3``: SIGSTOP SeaweedFS for 1-4 s (requests hang), then SIGCONT;
- ``bad_records``: malformed records written into ``_cluster/nodes/``,
  ``_cluster/fence/`` and ``_cluster/names/`` (string epochs, garbage,
  wrong ids, a future format, keys that are no epoch); while they are there
  every node still creates segments; they stay through the next round;
- ``hung_peer``: a registry record, kept fresh by the test, of a node whose
  address accepts connections and never answers, holding a segment name;
  a change to that name through any node returns OWNER_DOWN in bounded
  time; it stays through the next round;
- ``wipe_node`` (replicated mode only): SIGKILL a node, delete everything in
  its data directory (a dead disk: its journal, cache and the replicas it
  held for the others), restart it in place with ``--recover-from-tier2``:
  rebuilt from its replicas, it must hold every event it acknowledged;
- ``takeover``: a node's id is taken over with its old process alive: its
  writer is quiesced (flushed), the node flushed, a new daemon with an
  empty data directory runs ``serve --recover-from-tier2``; once it serves,
  the old process has acknowledged nothing (an appender hammering it
  directly sees no acknowledgement after that) and refuses a direct
  append, fenced; then it is killed and the new process is that node.

After every round: every node is alive (none stopped by anything but the
test's own kills); every acknowledged event is in its segment exactly once
and in order, read from the owner over the protocol, and every node's view
(over the protocol and through its mount) shows at least that, byte for
byte, once the owner answers again; online ``fsck`` finds nothing on any
node.

In replicated mode (`test_torture_cluster_replicated`) every node sends its
journal to the other two (``write_quorum = 3, ack_quorum = 2``), a takeover
recovers from the replicas, and containers fail over (``cluster.takeover``):
``wipe_node``, ``auto_takeover`` (kill -9, left down until a survivor runs
its container, then started again: a handback) and ``drain`` (``cluster
drain``, the node exits 0, started again) join the faults, and a node that
stopped by itself after its container moved (exit 0, or 48 when fenced) is
started again before each check, as systemd would.

The CI run lasts ``SEGMENT_GATEWAY_TORTURE_CLUSTER_SECONDS`` (else
``SEGMENT_GATEWAY_TORTURE_SECONDS``; default 10) of rounds after every kind
has run once; ``make torture`` runs it for 30 minutes. The seed is
``SEGMENT_GATEWAY_TORTURE_SEED``; ``SEGMENT_GATEWAY_TORTURE_FAULTS=kill_s3,stop_s3``
injects only the kinds named. The writers' and clients' log goes to
``clients.log`` beside the daemons' data directories.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.client.writer import RETRYABLE, SegmentWriter, open_segment_writer
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import BlackHole, record
from tests.helpers.daemon import ROOT, run_cli, scrape
from tests.helpers.mount import MountedDaemon, force_unmount, require_fuse
from tests.helpers.wait import async_wait_for, wait_for
from tests.torture import check_lines

# serial: fault timings and a SIGKILL under load (tests/conftest.py); timed out
# on a second xdist worker beside Spark on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

SECONDS = float(
    os.environ.get(
        "SEGMENT_GATEWAY_TORTURE_CLUSTER_SECONDS",
        os.environ.get("SEGMENT_GATEWAY_TORTURE_SECONDS", "10"),
    )
)
NODES = ("node-a", "node-b", "node-c")
ALL_FAULTS = (
    *("kill_node", "stop_node", "kill_s3", "stop_s3"),
    *("bad_records", "hung_peer", "takeover"),
)
#: The kinds this run injects: all, or those ``SEGMENT_GATEWAY_TORTURE_FAULTS``
#: names (comma-separated), to hammer one kind while chasing a bug.
FAULTS = (
    tuple(f for f in os.environ.get("SEGMENT_GATEWAY_TORTURE_FAULTS", "").split(",") if f)
    or ALL_FAULTS
)
assert set(FAULTS) <= set(ALL_FAULTS), FAULTS
#: In replicated mode also: a node's disk lost (a round of its own).
REPLICATED_FAULTS = (*FAULTS, "wipe_node", "auto_takeover", "drain")
#: Faults that may come second in a round (a takeover is a round of its own).
SECOND = ("kill_node", "stop_node", "kill_s3", "stop_s3")
#: The bucket prefix of the nodes' tier2.url.
PREFIX = "gw"
#: How long a view may take to catch up with the owner once it is back: a
#: node restarted, SeaweedFS restarted, heartbeats and leases renewed.
CATCH_UP = 90.0
#: A read through a mount may wait on a stopped owner (5 s per tail read)
#: or a stopped SeaweedFS; longer than this is a hang.
MOUNT_READ_BOUND = 45.0

CONFIG = """
[node]
id = "{node}"
[journal]
file_size = "4 MiB"
preallocate_step = "1 MiB"
max_pending_bytes = "4 MiB"
max_group_bytes = "1 MiB"
max_frame_bytes = "256 KiB"
max_operation_bytes = "1 MiB"
[container]
max_append_bytes = "512 KiB"
[server]
max_message_bytes = "1 MiB"
max_memory = "64 MiB"
[tier2]
url = "s3://{bucket}/{prefix}"
endpoint_url = "{endpoint}"
flush_size = "64 KiB"
flush_interval = "1s"
max_chunk_size = "1 MiB"
snapshot_interval = "1s"
retry_deadline = "10s"
request_timeout = "5s"
gc_interval = "5s"
gc_grace = "60s"
[cluster]
heartbeat_interval = "0.5s"
down_after = "3s"
refresh_interval = "0.25s"
lease = "2s"
[fuse]
active_timeout = "0.2s"
"""
REPLICATION = """
[replication]
write_quorum = 3
ack_quorum = 2
ack_timeout = "20s"
peer_timeout = "1s"
"""


def segment(node: str) -> str:
    """The segment ``node`` owns and its writer writes."""
    return f"torture/{node}"


def line(k: int, n: int) -> bytes:
    """Line ``n`` (event ``n + 1``) of writer ``k``."""
    return b"%s-%08d" % (NODES[k].encode(), n)


def check_prefix(k: int, data: bytes, at_least: int, where: str) -> int:
    """``data`` is lines 0.. of writer ``k``, whole, in order, none twice; at least ``at_least``."""
    return check_lines(data, lambda i: line(k, i), at_least, where, segment(NODES[k]))


def whole_lines(data: bytes) -> bytes:
    """``data`` up to its last newline (a reader may catch a file between two sizes)."""
    return data[: data.rfind(b"\n") + 1]


class ClusterTorture:
    """The cluster, its SeaweedFS, the writers' state and the fault injectors."""

    def __init__(self, tmp: pathlib.Path, seed: int, replicated: bool = False) -> None:
        self.tmp = tmp
        self.replicated = replicated
        self.seed = seed
        self.rng = random.Random(seed)
        self.s3 = EmbeddedS3(tmp / "s3")
        self.bucket_name = f"torture-{uuid.uuid4().hex[:12]}"
        self.bucket: S3Storage | None = None
        self.env: dict[str, str] = {}
        #: The process that is each node now (a takeover replaces it).
        self.daemons: dict[str, MountedDaemon] = {}
        #: Every process made, old ones included (teardown stops them all).
        self.made: list[MountedDaemon] = []
        #: Generation of each node id (bumped by a takeover: new data dir).
        self.generation = dict.fromkeys(NODES, 0)
        self.faults: collections.Counter[str] = collections.Counter()
        self.rounds = 0
        #: Highest event number acknowledged to each writer.
        self.acked = [0] * len(NODES)
        #: Resends the daemons recognised as stored already, over closed writers.
        self.duplicates = 0
        #: A writer is quiesced while its hold event is set (cleared: it goes on).
        self.hold: list[trio.Event | None] = [None] * len(NODES)
        self.held: list[trio.Event] = [trio.Event() for _ in NODES]
        #: A writer whose home node moved reopens with the new address.
        self.rehome = [False] * len(NODES)
        #: The writers now (for their statistics).
        self.writers: list[SegmentWriter | None] = [None] * len(NODES)
        self.reader_bytes = 0
        self.reader_checks = 0
        self.reconnects = 0
        #: Cleanups of faults that outlive their round (bad records, the hung peer).
        self.lingering: list[tuple[int, Callable[[], None]]] = []
        #: SIGSTOPped pids (continued in teardown whatever happens).
        self.stopped: set[int] = set()
        self.zombie_acks_after_ready = 0
        self.zombie_refusals: list[str] = []

    # -- setup and teardown ----------------------------------------------------------

    def config(self, node: str) -> str:
        return CONFIG.format(
            node=node, bucket=self.bucket_name, prefix=PREFIX, endpoint=self.s3.endpoint_url
        ) + (REPLICATION if self.replicated else "")

    def make_daemon(self, node: str) -> MountedDaemon:
        gen = self.generation[node]
        name = node if gen == 0 else f"{node}-takeover{gen}"
        d = MountedDaemon(
            self.tmp / name, self.tmp / f"{name}-mnt", config_text=self.config(node), env=self.env
        )
        self.made.append(d)
        return d

    def start(self) -> None:
        self.s3.start(timeout=90)
        self.env = {
            "AWS_ACCESS_KEY_ID": self.s3.access_key,
            "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
        }
        self.bucket = S3Storage(
            self.bucket_name,
            PREFIX,
            endpoint_url=self.s3.endpoint_url,
            access_key=self.s3.access_key,
            secret_key=self.s3.secret_key,
        )
        self.bucket.create_bucket_if_missing()
        for node in NODES:
            self.daemons[node] = self.make_daemon(node)
            self.daemons[node].start(timeout=120)

    def close(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        for _, cleanup in self.lingering:
            with contextlib.suppress(Exception):
                cleanup()
        failed: list[BaseException] = []
        for d in self.made:
            try:
                d.teardown()
            except Exception as e:  # the others must still go
                failed.append(e)
        if self.bucket is not None:
            self.bucket.close()
        self.s3.stop()
        if failed:
            raise failed[0]

    def address(self, node: str) -> str:
        return self.daemons[node].address

    def home(self, k: int) -> str:
        """Where writer ``k`` connects: the next node, not the owner."""
        return self.address(NODES[(k + 1) % len(NODES)])

    # -- faults ------------------------------------------------------------------------

    async def inject(self, fault: str, seconds: float) -> str:
        """Run one fault; a short description for the round's line."""
        self.faults[fault] += 1
        rng = self.rng
        if fault == "kill_node":
            node = rng.choice(NODES)
            pause = rng.uniform(0, 1.0)
            await trio.to_thread.run_sync(self.restart_node, node, pause)
            await trio.sleep(seconds)
            return f"kill_node({node})"
        if fault == "stop_node":
            node = rng.choice(NODES)
            d = self.daemons[node]
            assert d.proc is not None
            await self.pause(d.proc.pid, rng.uniform(1.0, 4.0))
            await trio.sleep(seconds)
            return f"stop_node({node})"
        if fault == "kill_s3":
            await self.restart_s3(rng.uniform(0, 2.0))
            await trio.sleep(seconds)
            return "kill_s3"
        if fault == "stop_s3":
            assert self.s3.pid is not None
            await self.pause(self.s3.pid, rng.uniform(1.0, 4.0))
            await trio.sleep(seconds)
            return "stop_s3"
        if fault == "bad_records":
            await trio.to_thread.run_sync(self.bad_records)
            await trio.sleep(seconds)
            return "bad_records"
        if fault == "hung_peer":
            await trio.to_thread.run_sync(self.hung_peer)
            await trio.sleep(seconds)
            return "hung_peer"
        # Faults on one node picked at random, a round of their own.
        on_node: dict[str, Callable[[str], Awaitable[object]]] = {
            "auto_takeover": self.auto_takeover,
            "drain": self.drain,
            "wipe_node": partial(trio.to_thread.run_sync, self.wipe_node),
            "takeover": self.takeover,
        }
        if fault in on_node:
            node = rng.choice(NODES)
            await on_node[fault](node)
            await trio.sleep(seconds)
            return f"{fault}({node})"
        raise AssertionError(fault)

    async def hosted_elsewhere(self, node: str, patience: float) -> str:
        """Until another node runs ``node``'s container and it serves; that node."""
        others = [n for n in NODES if n != node]

        async def hosted() -> str:
            for via in others:
                try:
                    async with open_client(self.address(via)) as c:
                        for n in await c.cluster():
                            if n.id == node and n.hosted_by and n.state == "up":
                                return n.hosted_by
                except (GatewayError, OSError):
                    continue
            return ""

        found: list[str] = []

        async def check() -> bool:
            found.append(await hosted())
            return bool(found[-1])

        await async_wait_for(check, patience, f"{node}'s container taken over")
        return found[-1]

    async def auto_takeover(self, node: str) -> None:
        """kill -9 a node and leave it down: a survivor takes its container over; then
        it comes back and takes it back (handback)."""
        d = self.daemons[node]
        await trio.to_thread.run_sync(d.kill)
        await trio.to_thread.run_sync(force_unmount, d.mnt)
        host = await self.hosted_elsewhere(node, CATCH_UP)
        # hosted_by is registered as the takeover begins; the host logs once it serves.
        host_log = self.daemons[host].log_path
        await trio.to_thread.run_sync(
            lambda: wait_for(lambda: "took over in" in host_log.read_text(), CATCH_UP,
                             f"{host} serving {node}'s container")
        )  # fmt: skip
        await trio.to_thread.run_sync(lambda: start_as_systemd(d, 180))

    async def drain(self, node: str) -> None:
        """``cluster drain`` a live node (it exits 0), then start it again (handback)."""
        d = self.daemons[node]
        via = self.address(NODES[(NODES.index(node) + 1) % len(NODES)])
        r = await trio.to_thread.run_sync(
            lambda: run_cli("cluster", "drain", node, "--connect", via, timeout=240)
        )
        assert r.returncode == 0, f"drain of {node}: {r.stdout}\n{r.stderr}"
        assert d.proc is not None
        code = await trio.to_thread.run_sync(lambda: d.proc.wait(60) if d.proc else None)
        assert code == 0, f"the drained {node} exited {code}:\n{d.log()}"
        await trio.to_thread.run_sync(lambda: start_as_systemd(d, 180))

    def supervise(self) -> list[str]:
        """As systemd would: start again a node that stopped by itself after its container
        moved (exit 0 after a handover, 48 when fenced); the nodes restarted."""
        restarted: list[str] = []
        if not self.replicated:
            return restarted
        # All at once, as systemd restarts each node by itself: a node taking
        # its container back recovers from its replicas, and cannot be ready
        # while a node holding one waits for its own turn to start.
        starting: list[tuple[str, threading.Thread]] = []
        failures: list[BaseException] = []

        def start(d: MountedDaemon) -> None:
            try:
                start_as_systemd(d, 180)
            except BaseException as e:
                failures.append(e)

        for node, d in self.daemons.items():
            if d.alive() or d.proc is None or d.proc.returncode not in (0, 48):
                continue
            code = d.proc.returncode
            force_unmount(d.mnt)
            thread = threading.Thread(target=start, args=(d,), daemon=True)
            thread.start()
            starting.append((node, thread))
            restarted.append(f"{node} (exit {code})")
        for _, thread in starting:
            thread.join()
        if failures:
            raise failures[0]
        return restarted

    def restart_node(self, node: str, pause: float) -> None:
        d = self.daemons[node]
        d.kill()
        time.sleep(pause)
        start_as_systemd(d, 120)

    def wipe_node(self, node: str) -> None:
        """A dead disk: kill, delete the data directory's contents, rebuild from replicas."""
        d = self.daemons[node]
        d.kill()
        force_unmount(d.mnt)
        for entry in d.data_dir.iterdir():
            if entry.name in ("gateway.toml", "daemon.log"):
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        d.start(timeout=180, serve_args=("--recover-from-tier2",))
        assert "recovered node " + node + " from replica" in d.log(), d.log()
        # Every node's ensemble whole again (the wiped node's replicas of the
        # others are caught up) before the next fault may take another copy.
        for other in NODES:
            port = self.daemons[other].metrics_port

            def whole(port: int = port) -> bool:
                m = scrape(port)
                caught = [v for k, v in m.items()
                          if k.startswith("segment_gateway_replication_peer_caught_up{")
                          and 'member="1"' in k]  # fmt: skip
                return (
                    m.get("segment_gateway_replication_ensemble_size", 0) == 2
                    and m.get("segment_gateway_replication_quorum", 0) == 1
                    and len(caught) == 2
                    and all(caught)
                )

            wait_for(whole, CATCH_UP, f"{other}'s ensemble whole after wiping {node}")

    async def pause(self, pid: int, seconds: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        try:
            await trio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)

    async def restart_s3(self, down: float) -> None:
        """SIGKILL SeaweedFS; after ``down`` s start it again on the same ports and data."""
        assert self.s3.pid is not None
        self.s3.kill()  # SIGKILL, as a crash; prepare() below reaps it
        await trio.sleep(down)
        await trio.to_thread.run_sync(lambda: self.s3.prepare(same_ports=True))
        # From this (the main) thread: weed dies with the thread that started it.
        self.s3.spawn(same_ports=True)
        await trio.to_thread.run_sync(self.s3.wait_ready, 90)

    def bad_records(self) -> None:
        """Malformed records in every part of ``_cluster/``; removed after the next round."""
        assert self.bucket is not None
        now = int(time.time() * 1000)
        victim = self.rng.choice(NODES)

        def claim(claimed: str, **doc: object) -> tuple[str, bytes]:
            key = "_cluster/names/" + hashlib.sha256(claimed.encode()).hexdigest()
            return key, json.dumps(doc).encode()

        def node_record(node: str, **changes: object) -> bytes:
            doc = json.loads(record(node, "127.0.0.1:1", now))
            doc.update(changes)
            return json.dumps(doc).encode()

        bad: dict[str, bytes] = {
            "_cluster/nodes/node-x.json": record("node-x", "127.0.0.1:1", now, epoch="5"),
            "_cluster/nodes/node-y.json": b"\x00\xff garbage, not JSON",
            "_cluster/nodes/node-w.json": record("node-v", "127.0.0.1:1", now),
            "_cluster/nodes/node-f.json": record("node-f", "127.0.0.1:1", now, format=99),
            "_cluster/nodes/node-l.json": node_record("node-l", advertise=7),
            "_cluster/nodes/README": b"not a record",
            "_cluster/nodes/sub/node-s.json": record("node-s", "127.0.0.1:1", now),
            f"_cluster/fence/{victim}/not-an-epoch": b"{}",
            f"_cluster/fence/{victim}/-3": b"{}",
            f"_cluster/fence/{victim}/{'9' * 25}": b"{}",  # too long to be an epoch
            f"_cluster/fence/{victim}/{'9' * 20}": b"{}",  # past int64
            f"_cluster/fence/{victim}/00000000000000000002.tmp": b"{}",
            "_cluster/fence/node-q/00000000000000000007": b"\x00garbage body",
            "_cluster/fence/node-r/00000000000000000003": json.dumps(
                {"format": 1, "node": "node-r", "epoch": "3"}
            ).encode(),
            "_cluster/fence/stray": b"no node id",
            "_cluster/names/not-a-hash": b"garbage",
        }
        for key, data in (
            claim("torture/bad/garbage", format=1, name=1, node=[], epoch=None),
            claim("torture/bad/epoch", format=1, name="torture/bad/epoch", node="node-a",
                  epoch="5"),
            claim("torture/bad/future", format=99, name="torture/bad/future", node="node-b",
                  epoch=1),
            claim("torture/bad/wrong", format=1, name="torture/other", node="node-z", epoch=1),
        ):  # fmt: skip
            bad[key] = data
        bad["_cluster/names/" + hashlib.sha256(b"torture/bad/json").hexdigest()] = b"[1, 2"
        # A real node's own record replaced by one of a future version (its
        # next heartbeat rewrites it).
        bad[f"_cluster/nodes/{victim}.json"] = record(victim, "127.0.0.1:1", now, format=2)
        for key, data in bad.items():
            self.bucket.write(key, data, {})
        # While they are there every node still takes creates and appends.
        time.sleep(1.5)  # a few registry reads: surviving them is the subject
        for node in NODES:
            name = f"torture/extra/r{self.rounds}-{node}"
            with SyncClient(self.address(node)) as c:
                c.create(name, codec="lines")
                assert c.append(name, b"created among bad records\n").offset == 0

        def remove() -> None:
            assert self.bucket is not None
            for key in bad:
                if key != f"_cluster/nodes/{victim}.json":
                    self.bucket.delete(key)

        self.lingering.append((self.rounds + 1, remove))

    def hung_peer(self) -> None:
        """A node that heartbeats and never answers, holding a name; gone after the next round."""
        assert self.bucket is not None
        hole = BlackHole()
        stop = threading.Event()
        bucket = self.bucket

        def heartbeat() -> None:
            started = int(time.time() * 1000)
            while not stop.is_set():
                beat = int(time.time() * 1000)
                with contextlib.suppress(Exception):  # SeaweedFS may be down meanwhile
                    bucket.write(
                        "_cluster/nodes/node-h.json",
                        record("node-h", hole.address, beat, started_at_ms=started),
                        {},
                    )
                stop.wait(0.5)

        beating = threading.Thread(target=heartbeat, daemon=True)
        beating.start()
        name = "torture/hung/seg"
        claim_key = "_cluster/names/" + hashlib.sha256(name.encode()).hexdigest()
        claim = {"format": 1, "name": name, "node": "node-h", "epoch": 1}
        bucket.write(claim_key, json.dumps(claim).encode(), {})
        # Every node lists it, and a change to its name through any node ends
        # within the client's timeout, naming the owner.
        via = self.rng.choice(NODES)

        def listed() -> bool:
            r = run_cli("cluster", "--json", "--connect", self.address(via))
            assert r.returncode == 0, r.stderr
            return "node-h" in {json.loads(n)["id"] for n in r.stdout.splitlines()}

        wait_for(listed, 30, "node-h listed", interval=0.2)
        started = time.monotonic()
        r = run_cli("append", "--timeout", "5", name, "--connect", self.address(via),
                    input_text="x\n", timeout=60)  # fmt: skip
        took = time.monotonic() - started
        assert r.returncode == 45, (r.returncode, r.stderr)
        assert f"segment {name!r} belongs to node node-h" in r.stderr, r.stderr
        assert took < 5 + 15, took

        def remove() -> None:
            stop.set()
            beating.join(10)
            bucket.delete("_cluster/nodes/node-h.json")
            bucket.delete(claim_key)
            hole.close()

        self.lingering.append((self.rounds + 1, remove))

    async def quiesce(self, k: int) -> trio.Event:
        """Stop writer ``k`` with everything it wrote acknowledged; set the result to resume."""
        resume = trio.Event()
        self.held[k] = trio.Event()
        self.hold[k] = resume
        with trio.move_on_after(CATCH_UP):
            await self.held[k].wait()
            return resume
        w = self.writers[k]
        raise AssertionError(
            f"writer {k} did not get everything it wrote acknowledged within {CATCH_UP:g}s: "
            f"{w.statistics() if w else None}, at {w.address if w else None}"
        )

    def release(self, k: int, resume: trio.Event) -> None:
        self.hold[k] = None
        resume.set()

    async def takeover(self, node: str) -> None:
        """Take ``node``'s id over with its old process alive; the new process is the node."""
        k = NODES.index(node)
        old = self.daemons[node]
        resume = await self.quiesce(k)
        try:
            async with open_client(old.address) as c:
                await c.flush()
                # A segment the appender below hammers directly on the old process.
                zombie_seg = f"torture/zombie/r{self.rounds}"
                await c.create(zombie_seg)
            acks: list[float] = []
            refusals: list[str] = []
            stop = threading.Event()

            def hammer() -> None:
                with SyncClient(old.address) as direct:
                    i = 0
                    while not stop.is_set():
                        try:
                            direct.append(zombie_seg, b"%08d\n" % i)
                            acks.append(time.monotonic())
                        except GatewayError as e:
                            refusals.append(str(e))
                        i += 1
                        stop.wait(0.02)

            hammering = threading.Thread(target=hammer, daemon=True)
            hammering.start()
            self.generation[node] += 1
            new = self.make_daemon(node)
            await trio.to_thread.run_sync(
                lambda: new.start(timeout=180, serve_args=("--recover-from-tier2",))
            )
            ready_at = time.monotonic()
            await trio.sleep(1.0)
            stop.set()
            await trio.to_thread.run_sync(hammering.join, 10)
            late = [t for t in acks if t > ready_at]
            self.zombie_acks_after_ready += len(late)
            assert not late, f"the old {node} acknowledged {len(late)} append(s) after the takeover"
            assert acks, "the old process acknowledged nothing before the takeover"
            assert refusals, "the old process refused nothing"
            self.zombie_refusals.append(refusals[-1])

            # The old process: fenced, refusing a direct append of a line its
            # writer could have sent -- or, replicated (its container can
            # move), stopped by itself once fenced: exit 48.
            def append_directly() -> None:
                with SyncClient(old.address) as direct:
                    direct.append(segment(node), line(k, 10**7) + b"\n")

            if self.replicated:
                await trio.to_thread.run_sync(
                    lambda: wait_for(lambda: not old.alive(), 60, f"the fenced {node} to stop")
                )
                assert old.proc is not None and old.proc.returncode == 48, old.log()
            else:
                assert old.alive(), f"the old {node} exited:\n{old.log()}"
                with pytest.raises(GatewayError, match="taken over"):
                    await trio.to_thread.run_sync(append_directly)
            # Fenced by its lease ("has been taken over") or at its replicas
            # ("this process was taken over").
            assert "taken over" in old.log(), old.log()
            # The new process is the node from now on.
            self.daemons[node] = new
            await trio.to_thread.run_sync(old.kill)
            await trio.to_thread.run_sync(force_unmount, old.mnt)
            # The writer whose home the old process was connects to the new one.
            self.rehome[(k - 1) % len(NODES)] = True
        finally:
            self.release(k, resume)


async def writer_task(
    t: ClusterTorture, k: int, stop: trio.Event, *, task_status: trio.TaskStatus[None]
) -> None:
    """Writer ``k``: numbered lines to the segment of node ``k``, through the next node."""
    started = False
    while not stop.is_set():
        t.rehome[k] = False
        w = await open_writer(t, k)
        async with w as writer:
            t.writers[k] = writer
            n = writer.next_event_number - 1
            if not started:
                task_status.started()
                started = True
            while not stop.is_set() and not t.rehome[k]:
                resume = t.hold[k]
                if resume is not None:
                    await writer.flush()
                    t.acked[k] = max(t.acked[k], writer.acked_event)
                    t.held[k].set()
                    await resume.wait()
                    continue
                await writer.write(line(k, n))
                n += 1
                t.acked[k] = max(t.acked[k], writer.acked_event)
                if n % 20 == 0:
                    await trio.sleep(0.02)
        t.acked[k] = max(t.acked[k], writer.acked_event)
        t.reconnects += writer.reconnects
        t.duplicates += writer.duplicates


async def open_writer(t: ClusterTorture, k: int) -> Any:
    """`open_segment_writer` for writer ``k``, entered once its first connection works."""
    deadline = trio.current_time() + CATCH_UP
    while True:
        cm = open_segment_writer(
            t.home(k),
            segment(NODES[k]),
            codec="lines",
            writer_id=uuid.UUID(int=(k + 1) << 64).bytes,
            max_batch_bytes=4096,
            reconnect_timeout=600,
        )
        try:
            writer = await cm.__aenter__()
        except RETRYABLE:
            # The first connection of a writer does not retry by itself.
            assert trio.current_time() < deadline, f"writer {k} cannot connect"
            await trio.sleep(0.5)
            continue
        return _Entered(cm, writer)


class _Entered:
    """An async context manager already entered: yields its value, exits the original."""

    def __init__(self, cm: Any, value: Any) -> None:
        self.cm, self.value = cm, value

    async def __aenter__(self) -> Any:
        return self.value

    async def __aexit__(self, *exc: object) -> Any:
        return await self.cm.__aexit__(*exc)


async def protocol_reader(t: ClusterTorture, k: int, via: str, stop: trio.Event) -> None:
    """Follows segment ``k`` over the protocol through node ``via``: always a prefix."""
    name = segment(NODES[k])
    seen = bytearray()
    while not stop.is_set():
        try:
            async with open_client(t.address(via), connect_timeout=5) as c:
                while not stop.is_set():
                    with trio.fail_after(60):
                        r = await c.read(name, len(seen), 1 << 20, wait=0.5)
                    seen += r.data
                    t.reader_bytes += len(r.data)
                    t.reader_checks += 1
                    check_prefix(k, whole_lines(bytes(seen)), 0, f"protocol reader of {name} "
                                 f"via {via}")  # fmt: skip
        except (GatewayError, OSError):
            await trio.sleep(0.3)  # the node is down, restarting, or busy: come back


def mount_read(t: ClusterTorture, k: int, via: str) -> None:
    """Segment ``k`` through node ``via``'s mount (in a thread): a prefix too."""
    path = t.daemons[via].mnt / segment(NODES[k])
    try:
        data = path.read_bytes()
    except OSError:
        return  # the node is down (ENOTCONN), the tail unreadable (EIO), not there yet
    check_prefix(k, whole_lines(data), 0, f"mount reader of {path}")
    t.reader_bytes += len(data)
    t.reader_checks += 1


async def mount_reader(t: ClusterTorture, via: str, stop: trio.Event) -> None:
    while not stop.is_set():
        for k in range(len(NODES)):
            with trio.move_on_after(MOUNT_READ_BOUND) as scope:
                await trio.to_thread.run_sync(mount_read, t, k, via, abandon_on_cancel=True)
            assert not scope.cancelled_caught, (
                f"a read through {via}'s mount hung for {MOUNT_READ_BOUND:g}s"
            )
        await trio.sleep(0.5)


async def read_all(address: str, name: str, at_least: int = 0) -> bytes:
    """Every committed byte of ``name`` as the node at ``address`` sees it."""
    async with open_client(address, connect_timeout=5) as c:
        info = await c.info(name)
        data = bytearray()
        while len(data) < max(info.length, at_least):
            r = await c.read(name, len(data), 4 << 20)
            if not r.data:
                break
            data += r.data
        return bytes(data)


#: How verify() polls a node: an unreachable node, a failed read or a read
#: past its bound mean "not yet"; an AssertionError (a wrong byte) fails at once.
NOT_YET_HERE: dict[str, Any] = {
    "interval": 0.25,
    "not_yet": (GatewayError, OSError, trio.TooSlowError),
}


#: Exit codes of a start that met its container taken over meanwhile (44: its
#: epoch registered by the process that took it over; 48: fenced). systemd's
#: Restart=on-failure starts it again, and that start takes the container back.
TAKEN_OVER_AT_START = (44, 48)


def start_as_systemd(d: MountedDaemon, timeout: float) -> None:
    """``d.start``, started again (as systemd would) while it exits taken over at start."""
    for attempt in range(3):
        try:
            d.start(timeout=timeout)
            return
        except RuntimeError:
            code = d.proc.returncode if d.proc is not None else None
            if code not in TAKEN_OVER_AT_START or attempt == 2:
                raise
            print(f"torture cluster: {d.data_dir.name} exited {code} at start; starting it again")
            force_unmount(d.mnt)


def alive_or_fail(t: ClusterTorture, where: str) -> None:
    for node, d in t.daemons.items():
        if not d.alive():
            code = d.proc.returncode if d.proc is not None else None
            raise AssertionError(f"{where}: {node} stopped by itself (exit {code}):\n{d.log()}")
    assert t.s3.pid is not None, f"{where}: SeaweedFS is not running"


async def verify(t: ClusterTorture) -> int:
    """Every acknowledged event once and in order, from the owner and in every node's view."""
    where = f"round {t.rounds}"
    async with trio.open_nursery() as nursery:
        await nursery.start(supervising, t, where)
        total = await verify_views(t, where)
        nursery.cancel_scope.cancel()
    await supervised(t, where)
    return total


async def supervised(t: ClusterTorture, where: str) -> None:
    """Every node alive, after starting again those that stopped by themselves (one
    that was stopping cleanly a moment ago has exited by the second look)."""
    for _ in range(3):
        restarted = await trio.to_thread.run_sync(t.supervise)
        if restarted:
            print(f"torture cluster: {where}: started again (as systemd would): {restarted}")
        if all(d.alive() for d in t.daemons.values()):
            break
        await trio.sleep(1.0)
    alive_or_fail(t, where)


async def supervising(t: ClusterTorture, where: str, *, task_status: Any) -> None:
    """As systemd does, for as long as a check runs: a node that stops by itself after
    its container moved is started again -- also one whose container a survivor takes
    over during the check (its heartbeat late after SeaweedFS came back slow)."""
    await supervised(t, where)
    task_status.started()
    while True:
        await trio.sleep(0.5)
        restarted = await trio.to_thread.run_sync(t.supervise)
        if restarted:
            print(f"torture cluster: {where}: started again (as systemd would): {restarted}")


async def verify_views(t: ClusterTorture, where: str) -> int:
    """`verify`'s reads: each segment from its owner, then every node's views of it."""
    acked = list(t.acked)
    total = 0
    owner_data: list[bytes] = []
    for k, node in enumerate(NODES):
        name = segment(node)

        async def from_owner(k: int = k, node: str = node, name: str = name) -> bytes:
            data = await read_all(t.address(node), name)
            check_prefix(k, data, 0, f"{where}: {name} on its owner")
            return data if data.count(b"\n") >= acked[k] else b""

        data = await async_wait_for(
            from_owner, CATCH_UP, f"{where}: {name} on its owner {node}", **NOT_YET_HERE
        )
        total += check_prefix(k, data, acked[k], f"{where}: {name} on its owner")
        owner_data.append(data)

    async def every_view_of(via: str) -> None:
        # One node's views, segment after segment (the nodes side by side).
        for k, node in enumerate(NODES):
            name, want = segment(node), owner_data[k]

            async def by_protocol(k: int = k, name: str = name, want: bytes = want) -> bool:
                got = await read_all(t.address(via), name, len(want))
                check_prefix(k, whole_lines(got), 0, f"{where}: {name} via {via}")
                return len(got) >= len(want) and got[: len(want)] == want

            async def by_mount(k: int = k, name: str = name, want: bytes = want) -> bool:
                path = t.daemons[via].mnt / name
                with trio.fail_after(MOUNT_READ_BOUND):
                    got = await trio.to_thread.run_sync(path.read_bytes, abandon_on_cancel=True)
                check_prefix(k, whole_lines(got), 0, f"{where}: {path}")
                return len(got) >= len(want) and got[: len(want)] == want

            await async_wait_for(
                by_protocol,
                CATCH_UP,
                f"{where}: {name} over the protocol via {via}",
                **NOT_YET_HERE,
            )
            await async_wait_for(
                by_mount, CATCH_UP, f"{where}: {name} through {via}'s mount", **NOT_YET_HERE
            )

    async with trio.open_nursery() as nursery:
        for via in NODES:
            nursery.start_soon(every_view_of, via)
    return total


def fsck(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "fsck", "--connect", address],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def fsck_is_clean(t: ClusterTorture) -> None:
    """Online fsck through every node finds nothing."""
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    async def one(node: str) -> None:
        results[node] = await trio.to_thread.run_sync(fsck, t.address(node))

    async with trio.open_nursery() as nursery:
        for node in NODES:
            nursery.start_soon(one, node)
    for node, r in results.items():
        assert r.returncode == 0, f"fsck on {node} found problems:\n{r.stdout}\n{r.stderr}"


@contextlib.contextmanager
def torture(tmp: pathlib.Path, seed: int, replicated: bool) -> Iterator[ClusterTorture]:
    # The writers' and clients' own log (reconnects, redirects), beside the daemons'.
    handler = logging.FileHandler(tmp / "clients.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    gateway_log = logging.getLogger("gateway")
    level = gateway_log.level
    gateway_log.addHandler(handler)
    gateway_log.setLevel(logging.INFO)
    t = ClusterTorture(tmp, seed, replicated)
    try:
        t.start()
        yield t
    finally:
        t.close()
        gateway_log.removeHandler(handler)
        gateway_log.setLevel(level)
        handler.close()


@pytest.mark.timeout(SECONDS + 900)
# The faults' own ERROR lines: a fenced old process says so; a read of
# another node's unflushed tail through a mount that meets the owner stopped,
# killed or no longer followed (its heartbeat stale: SeaweedFS down) fails
# once (EIO), and the view ends at the flushed length from then on.
@pytest.mark.expect_errors(
    r"node node-[abc] \(epoch \d+\) has been taken over by epoch \d+",
    r"read of 'torture/node-[abc]' at offset \d+ \(\d+ bytes\) failed: segment "
    r"'torture/node-[abc]': bytes from offset \d+ are only on node node-[abc], which does "
    r"not answer",
)
async def test_torture_cluster(tmp_path: pathlib.Path) -> None:
    await run_torture(tmp_path, FAULTS, replicated=False)


@pytest.mark.timeout(SECONDS + 900)
@pytest.mark.expect_errors(
    r"node node-[abc] \(epoch \d+\) has been taken over by epoch \d+",
    r"read of 'torture/node-[abc]' at offset \d+ \(\d+ bytes\) failed: segment "
    r"'torture/node-[abc]': bytes from offset \d+ are only on node node-[abc], which does "
    r"not answer",
    # A zombie learns of the takeover from a replica first; while a node is
    # stopped or SeaweedFS is down, the others may be below their ack quorum.
    r"replica node-[abc] refuses epoch \d+ of node node-[abc]",
    r"replication: no ack quorum",
)
async def test_torture_cluster_replicated(tmp_path: pathlib.Path) -> None:
    """The same faults with every journal on three nodes, and a node's disk wiped."""
    faults = REPLICATED_FAULTS if FAULTS == ALL_FAULTS else FAULTS
    await run_torture(tmp_path, faults, replicated=True)


async def run_torture(tmp_path: pathlib.Path, faults: tuple[str, ...], replicated: bool) -> None:
    require_fuse()
    seed = int(os.environ.get("SEGMENT_GATEWAY_TORTURE_SEED", "20261122"))
    began = time.monotonic()
    verified = 0
    kinds_run: list[str] = []
    with torture(tmp_path, seed, replicated) as t:
        for node in NODES:
            async with open_client(t.address(node)) as c:
                await c.create(segment(node), codec="lines")
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for k in range(len(NODES)):
                await nursery.start(writer_task, t, k, stop)
                for via in NODES:
                    nursery.start_soon(protocol_reader, t, k, via, stop)
            for via in NODES:
                nursery.start_soon(mount_reader, t, via, stop)
            order = t.rng.sample(faults, len(faults))
            deadline = trio.current_time() + SECONDS
            while t.rounds < len(faults) or trio.current_time() < deadline:
                t.rounds += 1
                round_began = time.strftime("%H:%M:%S")
                kinds = [order[(t.rounds - 1) % len(order)]]
                if kinds[0] not in ("takeover", "wipe_node") and t.rng.random() < 1 / 3:
                    second = [f for f in SECOND if f != kinds[0] and f in faults]
                    if second:
                        kinds.append(t.rng.choice(second))
                done = [await t.inject(kind, t.rng.uniform(0.5, 2.0)) for kind in kinds]
                verified = await verify(t)
                await fsck_is_clean(t)
                for due, cleanup in [c for c in t.lingering if c[0] <= t.rounds]:
                    await trio.to_thread.run_sync(cleanup)
                    t.lingering.remove((due, cleanup))
                kinds_run.append("+".join(done))
                print(
                    f"torture cluster: round {t.rounds} ({round_began}): {'+'.join(done)}; "
                    f"{verified} events "
                    f"verified on every node; acked {t.acked}"
                )
            stop.set()
        # Quiet now: every node flushes, and all agree.
        verified = await verify(t)
        for node in NODES:
            async with open_client(t.address(node)) as c:
                await c.flush()
        await fsck_is_clean(t)
        summary = {
            "seconds": SECONDS,
            "seed": seed,
            "rounds": t.rounds,
            "faults": dict(t.faults),
            "round_faults": kinds_run,
            "events_verified": verified,
            "acked": t.acked,
            "reader_bytes": t.reader_bytes,
            "reader_checks": t.reader_checks,
            "writer_reconnects": t.reconnects,
            "writer_duplicates": t.duplicates,
            "zombie_refusal": t.zombie_refusals[-1][:120] if t.zombie_refusals else "",
            "node_starts": {n: d.starts for n, d in t.daemons.items()},
            "elapsed_s": round(time.monotonic() - began),
        }
        print(f"torture cluster summary: {summary}")
    assert t.rounds >= len(faults) and set(t.faults) == set(faults), t.faults
    assert verified >= sum(t.acked) > 0
    assert all(a > 0 for a in t.acked), t.acked
    assert t.zombie_acks_after_ready == 0
