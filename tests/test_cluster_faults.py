"""The cluster under the faults a fleet sees every week: bad records, hung peers, dead owners.

Two real daemons with mounts on one SeaweedFS bucket (tests/helpers/cluster.py:
heartbeats every 0.5 s, down after 3 s). Into the bucket go records no node
wrote (a string epoch, garbage, a heartbeat from the future, a node whose
address accepts connections and never answers); a node is stopped with
SIGSTOP (alive, silent) or killed. Every node must keep serving, every wait
on another node must end within its bound, a read of flushed bytes must never
queue behind a stuck one, and a change to a dead owner's segment must say
which segment, which owner, and that it is down.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.writer import open_segment_writer
from gateway.embedded import EmbeddedS3
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import BlackHole, Cluster, record
from tests.helpers.daemon import ROOT, run_cli, scrape
from tests.helpers.mount import require_fuse
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NODES = ("node-a", "node-b")


@pytest.fixture
def cluster(seaweedfs: EmbeddedS3, tmp_path: pathlib.Path) -> Iterator[Cluster]:
    require_fuse()
    c = Cluster(tmp_path, seaweedfs, NODES)
    try:
        c.start()
        yield c
    finally:
        for d in c.daemons.values():
            if d.alive() and d.proc is not None:
                os.kill(d.proc.pid, signal.SIGCONT)
        c.teardown()


@pytest.fixture
def bucket(cluster: Cluster, seaweedfs: EmbeddedS3) -> Iterator[S3Storage]:
    """The cluster's bucket, written to directly (what no node wrote)."""
    storage = S3Storage(
        cluster.bucket,
        "gw",  # the nodes' tier2.url prefix
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    yield storage
    storage.close()


def nodes_listed(cluster: Cluster, on: str) -> dict[str, dict[str, object]]:
    r = run_cli("cluster", "--connect", cluster.daemons[on].address, "--json")
    assert r.returncode == 0, r.stderr
    return {n["id"]: n for n in map(json.loads, r.stdout.splitlines())}


def test_malformed_records_in_the_bucket_stop_no_node(cluster: Cluster, bucket: S3Storage) -> None:
    now = int(time.time() * 1000)
    bad = {
        "_cluster/nodes/node-x.json": record("node-x", "127.0.0.1:1", now, epoch="5"),
        "_cluster/nodes/node-y.json": b"\x00\xff garbage, not JSON",
        "_cluster/nodes/node-w.json": record("node-v", "127.0.0.1:1", now),
        "_cluster/nodes/README": b"not a record",
        "_cluster/fence/node-a/not-an-epoch": b"{}",
        "_cluster/fence/node-q/00000000000000000007": b"\x00garbage body",
    }
    claim = "_cluster/names/" + hashlib.sha256(b"claimed/badly").hexdigest()
    for key, data in {**bad, claim: b"[1, 2"}.items():
        bucket.write(key, data, {})
    # Several heartbeats and registry reads later, both nodes still serve.
    for node in NODES:
        wait_for(
            lambda node=node: "_cluster/nodes/node-x.json" in cluster.daemons[node].log(),
            10,
            f"{node} reading the bad records",
        )
    # Several more heartbeats with the bad records in place: surviving them
    # over time is the subject (no event says "still fine").
    time.sleep(2.0)
    for node in NODES:
        d = cluster.daemons[node]
        assert d.alive(), d.log()
        assert sorted(nodes_listed(cluster, node)) == sorted(NODES)
        log = d.log_path.read_text()
        assert log.count("skipping node record _cluster/nodes/node-x.json: field 'epoch' is "
                         "str '5', not an integer") == 1, log  # fmt: skip
        assert log.count("skipping node record _cluster/nodes/node-y.json: not JSON") == 1
        assert log.count("node-w.json: its id 'node-v' is not the node its key names") == 1
        assert log.count("_cluster/fence/node-a/not-an-epoch") == 1
        metrics = scrape(d.metrics_port)
        assert metrics['segment_gateway_tier2_records_rejected_total{kind="node record"}'] == 4
        assert metrics['segment_gateway_tier2_records_unusable{kind="node record"}'] == 4
        assert metrics['segment_gateway_tier2_records_rejected_total{kind="epoch fence"}'] >= 1
    # Changes go on, and a create whose name claim is damaged says so.
    with cluster.client("node-a") as c:
        c.create("a/after")
        assert c.append("a/after", b"still here\n").offset == 0
    r = run_cli("create", "claimed/badly", "--connect", cluster.daemons["node-a"].address)
    assert r.returncode == 27, r.stderr
    assert "name claim" in r.stderr and "unreadable" in r.stderr and claim in r.stderr
    assert "Traceback" not in r.stderr
    # A start with the bad records in place is a normal start.
    b = cluster.daemons["node-b"]
    assert b.stop(timeout=30) == 0
    b.start(timeout=60)
    assert sorted(nodes_listed(cluster, "node-b")) == sorted(NODES)
    # Repaired or removed records are forgotten.
    bucket.write("_cluster/nodes/node-x.json", record("node-x", "127.0.0.1:1", now - 60_000), {})
    for key in bad:
        if key != "_cluster/nodes/node-x.json":
            bucket.delete(key)
    wait_for(
        lambda: (
            scrape(cluster.daemons["node-a"].metrics_port).get(
                'segment_gateway_tier2_records_unusable{kind="node record"}', 0
            )
            == 0
        ),
        10,
        "the repaired records usable",
    )
    listed = nodes_listed(cluster, "node-a")
    assert listed["node-x"]["state"] == "down"


def _read_in_subprocess(
    path: pathlib.Path, offset: int, size: int, timeout: float
) -> tuple[float, int]:
    """(seconds taken, bytes read or the errno) of one pread, in a child (a hang cannot stick)."""
    code = (
        "import os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    n = len(os.pread(fd, int(sys.argv[3]), int(sys.argv[2])))\n"
        "except OSError as e:\n"
        "    n = -e.errno\n"
        "print(time.monotonic() - t, n)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(path), str(offset), str(size)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    took, n = r.stdout.split()
    return float(took), int(n)


@pytest.mark.serial  # a wall-time bound of a second or two (tests/conftest.py)
def test_a_stopped_owner_is_timed_out_and_down_for_readers(cluster: Cluster) -> None:
    a, b = cluster.daemons["node-a"], cluster.daemons["node-b"]
    name = "b/log"
    flushed = b"".join(b"flushed %06d\n" % i for i in range(1000))
    tail = b"".join(b"unflushed %06d\n" % i for i in range(1000))
    with cluster.client("node-b") as c:
        c.create(name, codec="lines")
        c.append(name, flushed)
        c.flush(name)
        c.append(name, tail)
        c.create("b/unflushed")
        for i in range(20):
            c.append("b/unflushed", b"event %d\n" % i)
    path = a.mnt / name
    wait_for(lambda: path.exists() and path.stat().st_size == len(flushed + tail), 5,
             "the whole segment on node-a")  # fmt: skip
    # node-a follows node-b by polling: a poll between b/log's last append and
    # b/unflushed's creation shows the first and not yet the second.
    unflushed = a.mnt / "b/unflushed"
    size = sum(len(b"event %d\n" % i) for i in range(20))
    wait_for(lambda: unflushed.exists() and unflushed.stat().st_size == size, 5,
             "b/unflushed on node-a")  # fmt: skip
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)  # alive, not answering
    try:
        # A change through node-a returns within its timeout, naming the
        # segment and the owner (before node-b is down: it does not answer
        # Hello; after: the registry says so).
        started = time.monotonic()
        r = run_cli("append", "--timeout", "5", name, "--connect", a.address,
                    input_text="lost?\n", timeout=60)  # fmt: skip
        assert time.monotonic() - started < 5 + 10, "append --timeout 5 took too long"
        assert r.returncode == 45, (r.returncode, r.stderr)
        assert f"segment {name!r} belongs to node node-b" in r.stderr, r.stderr
        # One stuck read of the tail never holds up a read of flushed bytes.
        stuck = threading.Thread(
            target=_read_in_subprocess, args=(path, len(flushed), 4096, 60), daemon=True
        )
        stuck.start()
        # Let the stuck reader reach its read in the kernel (a child process
        # blocked in FUSE gives no signal of it) before the flushed read runs.
        time.sleep(0.3)
        took, n = _read_in_subprocess(path, 0, 4096, 30)
        assert n == 4096 and took < 2.0, (took, n)
        stuck.join(30)
        # Down within down_after (3 s): the view ends at the flushed length,
        # says the tail is unavailable, and reads never wait.
        wait_for(lambda: nodes_listed(cluster, "node-a")["node-b"]["state"] == "down", 10,
                 "node-b listed down")  # fmt: skip
        wait_for(
            lambda: (
                path.stat().st_size == len(flushed)
                and os.getxattr(path, "user.segment.tail_available") == b"0"
            ),
            5,
            "the flushed-length view",
        )
        took, n = _read_in_subprocess(path, len(flushed) - 100, 4096, 30)
        assert n == 100 and took < 1.0, (took, n)
        assert path.read_bytes() == flushed
        # Metadata reads work from node-a's view; changes say the owner is down.
        r = run_cli("stat", name, "--connect", a.address)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        # The count of what it flushed, from its snapshot (one append).
        assert doc["length"] == len(flushed) and doc["event_count"] == 1, doc
        r = run_cli("attrs", name, "--connect", a.address)
        assert r.returncode == 0, r.stderr
        # Nothing of b/unflushed is readable: 0 bytes, and not 20 events.
        r = run_cli("ls", "-l", "b/", "--connect", a.address)
        assert r.returncode == 0, r.stderr
        lines = {ln.split()[-1]: ln.split()[:2] for ln in r.stdout.splitlines() if "b/" in ln}
        assert lines[name] == [str(len(flushed)), "1"], lines
        assert lines["b/unflushed"] == ["0", "?"], lines
        r = run_cli("stat", "b/unflushed", "--connect", a.address)
        assert r.returncode == 0 and json.loads(r.stdout)["event_count"] is None, r.stdout
        assert "user.segment.event_count" not in os.listxattr(a.mnt / "b/unflushed")
        for command in (("seal", name), ("delete", name), ("append", "--timeout", "5", name)):
            started = time.monotonic()
            r = run_cli(*command, "--connect", a.address, input_text="x\n", timeout=60)
            assert r.returncode == 45, (command, r.returncode, r.stderr)
            assert time.monotonic() - started < 10, command
            assert "node-b, which is down (no heartbeat for" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    # Back: the whole segment again, its tail readable.
    wait_for(
        lambda: (
            path.stat().st_size == len(flushed + tail)
            and os.getxattr(path, "user.segment.tail_available") == b"1"
        ),
        15,
        "node-b's whole view again",
    )
    assert path.read_bytes() == flushed + tail
    with cluster.client("node-a") as c:
        assert c.append(name, b"after\n").offset == len(flushed + tail)


def test_a_peer_that_never_answers_and_a_heartbeat_from_the_future(
    cluster: Cluster, bucket: S3Storage
) -> None:
    a = cluster.daemons["node-a"]
    hole = BlackHole()
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.is_set():
            beat = int(time.time() * 1000)
            bucket.write("_cluster/nodes/node-h.json", record("node-h", hole.address, beat), {})
            stop.wait(0.5)

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    # A segment name node-h holds, and a record that never changes, stamped an hour ahead.
    claim = {"format": 1, "name": "h/seg", "node": "node-h", "epoch": 1}
    key = "_cluster/names/" + hashlib.sha256(b"h/seg").hexdigest()
    bucket.write(key, json.dumps(claim).encode(), {})
    future = int(time.time() * 1000) + 3_600_000
    bucket.write("_cluster/nodes/node-f.json", record("node-f", hole.address, future), {})
    try:
        wait_for(lambda: {"node-h", "node-f"} <= set(nodes_listed(cluster, "node-a")), 10,
                 "the records listed")  # fmt: skip
        assert nodes_listed(cluster, "node-a")["node-h"]["state"] == "up"
        # An append to node-h's segment: the redirect's wait is bounded by the timeout.
        started = time.monotonic()
        r = run_cli("append", "--timeout", "5", "h/seg", "--connect", a.address,
                    input_text="x\n", timeout=60)  # fmt: skip
        took = time.monotonic() - started
        assert r.returncode == 45, (r.returncode, r.stderr)
        assert "segment 'h/seg' belongs to node node-h, which is not answering" in r.stderr
        assert took < 5 + 10, took
        # node-a itself is not held up: appends and reads of its own go on at once.
        with cluster.client("node-a") as c:
            c.create("a/own")
            t = time.monotonic()
            for i in range(20):
                c.append("a/own", b"%d\n" % i)
            assert time.monotonic() - t < 2.0
        # The heartbeat from the future went stale like any other.
        wait_for(lambda: nodes_listed(cluster, "node-a")["node-f"]["state"] == "down", 10,
                 "the future heartbeat down")  # fmt: skip
        assert nodes_listed(cluster, "node-a")["node-h"]["state"] == "up"
        assert a.alive()
    finally:
        stop.set()
        beating.join(5)
        hole.close()


def test_the_sync_client_follows_nothing_forever(cluster: Cluster) -> None:
    """A client connecting to a hung address gives up within its connect timeout."""
    hole = BlackHole()
    try:
        code = (
            "import sys, time, trio\n"
            "from gateway.client.client import open_client\n"
            "async def main():\n"
            "    t = time.monotonic()\n"
            "    try:\n"
            "        async with open_client(sys.argv[1], connect_timeout=2):\n"
            "            pass\n"
            "    except Exception as e:\n"
            "        print(round(time.monotonic() - t, 1), type(e).__name__, e)\n"
            "trio.run(main)\n"
        )
        r = subprocess.run([sys.executable, "-c", code, hole.address], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)  # fmt: skip
        took, kind, *rest = r.stdout.split()
        assert kind == "ConnectionLost" and float(took) < 4, r.stdout + r.stderr
        assert "did not answer Hello within 2s" in " ".join(rest)
    finally:
        hole.close()


async def test_a_writer_through_another_node_survives_its_owner_going_down(
    cluster: Cluster,
) -> None:
    """Its stored event number comes from the owner, never from a view of it.

    While the owner is down, the node the writer connects through knows the
    writer's event number only as the owner's last snapshot had it; a writer
    that took that for what is stored would see fewer events than it was
    acknowledged, and stop.
    """
    a, b = cluster.daemons["node-a"], cluster.daemons["node-b"]
    name = "a/exactly-once"
    async with open_client(a.address) as c:
        await c.create(name, codec="lines")
    writer_id = uuid.uuid4().bytes
    async with open_segment_writer(b.address, name, codec="lines", writer_id=writer_id,
                                   reconnect_timeout=120) as w:  # fmt: skip
        for i in range(100):
            await w.write(b"event %d" % i)
        await w.flush()
        async with open_client(a.address) as c:
            await c.flush(name)
        for i in range(100, 200):
            await w.write(b"event %d" % i)
        await w.flush()  # in node-a's journal only; its snapshot says 100
        assert w.acked_event == 200
        await trio.to_thread.run_sync(a.kill)

        def a_down() -> bool:
            return nodes_listed(cluster, "node-b")["node-a"]["state"] == "down"

        await trio.to_thread.run_sync(wait_for, a_down, 15, "node-a listed down")
        # The writer writes on; its appends wait for the owner.
        for i in range(200, 210):
            await w.write(b"event %d" % i)
        await trio.sleep(2.0)  # reconnects through node-b meanwhile
        await trio.to_thread.run_sync(lambda: a.start(timeout=60))
        await w.flush()
        assert w.acked_event == 210
    async with open_client(a.address) as c:
        data = (await c.read(name, 0, 1 << 20)).data
    assert data == b"".join(b"event %d\n" % i for i in range(210))
