"""Three nodes on one SeaweedFS bucket: one namespace in every node's mount.

Each node is a real daemon with its own data directory and mount; they share
``s3://BUCKET/gw``. Segments are written on every node (sealed and flushed,
flushed and active, only in the owner's journal), and every mount must show
all of them with the owner's bytes, sizes and xattrs; a stopped or killed
owner leaves its flushed bytes readable and says the tail is unavailable.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.container.results import SegmentInfo
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, SegmentExists, SegmentNotFound, SegmentSealed
from tests.helpers.cluster import NODES, Cluster, KiB, MiB
from tests.helpers.daemon import run_cli, scrape
from tests.helpers.mount import require_fuse
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(seaweedfs: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_fuse()
    c = Cluster(tmp_path_factory.mktemp("cluster"), seaweedfs)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


def payload(name: str, size: int) -> bytes:
    line = f"{name} ".encode()
    return (line * (size // len(line) + 1))[:size]


def test_every_mount_shows_every_segment_with_the_owners_bytes(cluster: Cluster) -> None:
    written: dict[str, tuple[str, bytes]] = {}
    for node in NODES:
        with cluster.client(node) as c:
            sealed = f"{node}/sealed"
            c.create(sealed)
            c.append(sealed, payload(sealed, 3 * MiB + 17))
            c.seal(sealed)
            c.flush(sealed)
            flushed = f"{node}/flushed-active"
            c.create(flushed)
            c.append(flushed, payload(flushed, 2 * MiB))
            c.flush(flushed)
            c.append(flushed, payload(flushed, 100 * KiB))  # tail only in the journal
            journal = f"{node}/journal-only"
            c.create(journal)
            c.append(journal, payload(journal, 300 * KiB + 5))
            for name in (sealed, flushed, journal):
                written[name] = (node, c.read(name, 0, 8 * MiB).data)
    for reader in NODES:
        mnt = cluster.daemons[reader].mnt

        def all_there(mnt: pathlib.Path = mnt) -> bool:
            return all(
                (mnt / name).exists() and (mnt / name).stat().st_size == len(data)
                for name, (_, data) in written.items()
            )

        # Within the documented bound (5 s) of the last write, for the first reader.
        wait_for(all_there, 5, f"every segment in {reader}'s mount")
        for name, (owner, data) in written.items():
            path = mnt / name
            assert path.read_bytes() == data, f"{name} read on {reader}"
            assert os.getxattr(path, "user.segment.node") == owner.encode()
            assert os.getxattr(path, "user.segment.tail_available") == b"1"
            assert os.getxattr(path, "user.segment.length") == str(len(data)).encode()
        assert sorted(os.listdir(mnt)) == sorted(NODES)


def test_remote_active_segment_grows_like_tail_f(cluster: Cluster) -> None:
    name = "node-b/growing"
    path = cluster.daemons["node-a"].mnt / name
    with cluster.client("node-b") as c:
        c.create(name)
        c.append(name, b"first line\n")
        # The create and the append may reach node-a in different polls.
        wait_for(
            lambda: path.exists() and path.stat().st_size == 11, 5, "the new segment on node-a"
        )
        with path.open("rb") as f:
            assert f.read() == b"first line\n"
            for i in range(3):
                line = f"line {i}\n".encode()
                c.append(name, line)
                started = time.monotonic()
                got = wait_for(lambda line=line: f.read() or b"", 2, "an append seen remotely")
                assert got == line
                assert time.monotonic() - started < 2


def test_cluster_command_lists_every_node(cluster: Cluster) -> None:
    r = run_cli("cluster", "--connect", cluster.daemons["node-a"].address, "--json")
    assert r.returncode == 0, r.stderr
    nodes = [json.loads(line) for line in r.stdout.splitlines()]
    assert [n["id"] for n in nodes] == list(NODES)
    assert all(n["state"] == "up" for n in nodes)
    assert [n["self"] for n in nodes] == [True, False, False]
    assert all(n["advertise"] == cluster.daemons[n["id"]].address for n in nodes)
    assert all(n["heartbeat_age_s"] < 3 for n in nodes)
    r = run_cli("cluster", "--connect", cluster.daemons["node-b"].address)
    assert r.returncode == 0, r.stderr
    assert "node-b *" in r.stdout and "node-c" in r.stdout
    metrics = scrape(cluster.daemons["node-a"].metrics_port)
    assert metrics['segment_gateway_cluster_nodes{state="up"}'] == 3
    assert metrics["segment_gateway_cluster_fenced"] == 0
    assert metrics["segment_gateway_name_claims_total"] >= 3
    remote = metrics['segment_gateway_cluster_remote_segments{node="node-b",tail_available="1"}']
    assert remote >= 3


def test_a_deleted_remote_segment_goes_from_every_mount(cluster: Cluster) -> None:
    name = "node-c/short-lived"
    path = cluster.daemons["node-a"].mnt / name
    with cluster.client("node-c") as c:
        c.create(name)
        c.append(name, b"x" * 1000)
        wait_for(path.exists, 5, "the segment on node-a")
        with path.open("rb") as held:
            c.delete(name)
            wait_for(lambda: not path.exists(), 5, "the segment gone from node-a")
            with pytest.raises(OSError) as e:
                os.fstat(held.fileno())
                held.read()
            assert e.value.errno == errno.ESTALE


def test_racing_creates_one_name_exactly_one_node_wins(cluster: Cluster) -> None:
    name = "shared/contested"
    results: dict[str, object] = {}

    def create(node: str) -> None:
        with cluster.client(node) as c:
            try:
                results[node] = c.create(name)
            except GatewayError as e:
                results[node] = e

    threads = [threading.Thread(target=create, args=(n,)) for n in NODES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    winners = [n for n, r in results.items() if isinstance(r, SegmentInfo)]
    assert len(winners) == 1, results
    owner = winners[0]
    for node, r in results.items():
        if node != owner:
            assert isinstance(r, SegmentExists), r
            assert f"already exists on node {owner}" in str(r)
    # Deleted, the name is free for every node again.
    other = next(n for n in NODES if n != owner)
    with cluster.client(owner) as c:
        c.delete(name)
    with cluster.client(other) as c:
        assert c.create(name).name == name
        c.delete(name)


def test_changes_sent_to_another_node_follow_the_owner(cluster: Cluster) -> None:
    name = "node-b/followed"
    with cluster.client("node-b") as c:
        c.create(name)
    wait_for(lambda: (cluster.daemons["node-a"].mnt / name).exists(), 5, "seen on node-a")
    with cluster.client("node-a") as a:
        # Appends, attributes, seal: through node-a, to node-b.
        assert a.append(name, b"one\n").offset == 0
        assert a.append(name, b"two\n").offset == 4
        assert a.info(name).length == 8  # reads work from any node
        assert a.read(name, 0, 100).data == b"one\ntwo\n"
    # The CLI's exactly-once writer, pointed at the wrong node.
    r = run_cli("append", name, "--connect", cluster.daemons["node-c"].address,
                input_text="three\nfour\n")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = run_cli("cat", name, "--connect", cluster.daemons["node-c"].address)
    assert r.stdout == "one\ntwo\nthree\nfour\n"
    r = run_cli("ls", "node-b/", "--connect", cluster.daemons["node-a"].address)
    assert name in r.stdout.split()
    with cluster.client("node-b") as b:
        assert b.read(name, 0, 100).data == b"one\ntwo\nthree\nfour\n"
        b.seal(name)
    with cluster.client("node-c") as c, pytest.raises(SegmentSealed):
        c.append(name, b"late\n")


def test_a_segment_just_created_elsewhere_is_found_by_its_claim(cluster: Cluster) -> None:
    # Sent to node-c before node-c has polled node-a: its name claim says where
    # it lives. Reads and infos through node-c see it at once too (node-c
    # refreshes its view of node-a then), never SEGMENT_NOT_FOUND.
    with cluster.client("node-a") as a, cluster.client("node-c") as c:
        for i in range(5):
            name = f"node-a/fresh-{i}"
            a.create(name)
            assert c.info(name).length == 0
            assert c.append(name, b"first\n").offset == 0
            assert a.read(name, 0, 100).data == b"first\n"
            a.append(name, b"second\n")
            assert c.read(name, 0, 100).data == b"first\nsecond\n"
        name = "node-a/fresh-read"
        a.create(name)
        a.append(name, b"only\n")
        assert c.read(name, 0, 100).data == b"only\n"
    # A name nobody holds is simply not found.
    with cluster.client("node-c") as c, pytest.raises(SegmentNotFound):
        c.append("nobody/has-this", b"x")


def test_streams_and_transactions_through_another_node_follow_the_owner(
    cluster: Cluster,
) -> None:
    """A stream lives on the node that created it; its name is claimed cluster-wide,
    so writers, transactions and stream commands sent elsewhere follow it."""
    with cluster.client("node-a") as a:
        a.create_stream("node-a/clicks", {"roll_size": 8})
    with cluster.client("node-b") as b:
        with pytest.raises(SegmentExists):
            b.create_stream("node-a/clicks")
        landed = [b.append("node-a/clicks", b"event-%d\n" % i).segment for i in range(3)]
        assert landed == [f"node-a/clicks/00000000000{i}" for i in (1, 2, 3)]
        t = b.begin_transaction("node-a/clicks")
        b.append(t.name, b"txn-1\ntxn-2\n")
        done = b.commit_transaction(t.name)
        assert done.segment == "node-a/clicks/000000000004"
        info = b.stream("node-a/clicks")
        assert [s.name for s in info.segments][-1] == done.segment
    r = run_cli("append", "node-a/clicks", "--connect", cluster.daemons["node-c"].address,
                input_text="cli\n")  # fmt: skip
    assert r.returncode == 0, r.stderr
    with cluster.client("node-a") as a:
        names = [s.name for s in a.stream("node-a/clicks").segments]
        data = b"".join(a.read(n, 0, 100).data for n in names)
        assert data == b"event-0\nevent-1\nevent-2\ntxn-1\ntxn-2\ncli\n"
    # Every mount shows the stream's segments (the transaction never).
    for node in NODES:
        mnt = cluster.daemons[node].mnt
        wait_for(
            lambda mnt=mnt: sorted(os.listdir(mnt / "node-a/clicks")) == [n[-12:] for n in names],
            10,
            f"the stream in {node}'s mount",
        )
        assert not (mnt / ".txn").exists()
    with cluster.client("node-c") as c:
        c.delete_stream("node-a/clicks")
    with cluster.client("node-b") as b:
        b.create_stream("node-a/clicks")  # the name is free again, for any node
        b.delete_stream("node-a/clicks")


def test_a_stream_shows_on_every_mount_from_create_to_delete(cluster: Cluster) -> None:
    """Its directory is there before its first segment, on the owner and on the others."""
    name = "node-b/early"
    with cluster.client("node-b") as b:
        b.create_stream(name, codec="lines")
    for node in NODES:
        path = cluster.daemons[node].mnt / name
        wait_for(lambda path=path: path.is_dir() and os.listdir(path) == [], 10,
                 f"the empty stream in {node}'s mount")  # fmt: skip
    with cluster.client("node-b") as b:
        segment = b.append(name, b"one\ntwo\nthr").segment
    for node in NODES:
        path = cluster.daemons[node].mnt / segment
        wait_for(lambda path=path: path.exists() and path.stat().st_size == 8, 10,
                 f"the stream's lines segment in {node}'s mount")  # fmt: skip
        assert os.getxattr(path, "user.segment.codec") == b"lines"
    with cluster.client("node-b") as b:
        b.delete_stream(name)
    for node in NODES:
        path = cluster.daemons[node].mnt / name
        wait_for(lambda path=path: not path.exists(), 10, f"the stream gone from {node}'s mount")


def test_fsck_of_a_node_that_read_other_nodes_chunks_finds_nothing(cluster: Cluster) -> None:
    """Another node's chunks in this node's cache are a reader's copies, not garbage."""
    name = "node-b/read-elsewhere"
    data = payload(name, 2 * MiB + 3)
    with cluster.client("node-b") as c:
        c.create(name)
        c.append(name, data)
        c.flush(name)
    a = cluster.daemons["node-a"]
    path = a.mnt / name
    wait_for(lambda: path.exists() and path.stat().st_size == len(data), 5, "on node-a")
    assert path.read_bytes() == data  # through node-a's cache, from node-b's chunks
    r = run_cli("fsck", "--connect", a.address, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no segment names the chunk" not in r.stdout
    (cache_line,) = [ln for ln in r.stdout.splitlines() if "check cache" in ln]
    assert "other nodes' chunks" in cache_line, cache_line


def test_a_killed_owner_leaves_its_flushed_bytes_readable(cluster: Cluster) -> None:
    """Runs last in the module: node-c stays down."""
    name = "node-c/dies"
    data = payload(name, 2 * MiB)
    tail = b"unflushed tail\n"
    with cluster.client("node-c") as c:
        c.create(name)
        c.append(name, data)
        c.flush(name)
        c.append(name, tail)
    path = cluster.daemons["node-a"].mnt / name
    wait_for(lambda: path.exists() and path.stat().st_size == len(data) + len(tail), 5,
             "the segment on node-a")  # fmt: skip
    cluster.daemons["node-c"].kill()
    # Within the documented bound the file ends at what Tier 2 proves.
    wait_for(
        lambda: (
            os.getxattr(path, "user.segment.tail_available") == b"0"
            and path.stat().st_size == len(data)
        ),
        10,
        "the tail marked unavailable, the size cut back to the flushed length",
    )
    started = time.monotonic()
    assert path.read_bytes() == data
    assert time.monotonic() - started < 5
    sealed = cluster.daemons["node-b"].mnt / "node-c/sealed"
    assert sealed.stat().st_size == 3 * MiB + 17
    assert sealed.read_bytes() == payload("node-c/sealed", 3 * MiB + 17)
    r = run_cli("cluster", "--connect", cluster.daemons["node-a"].address, "--json")
    states = {json.loads(line)["id"]: json.loads(line)["state"] for line in r.stdout.splitlines()}
    wait_for(
        lambda: (
            json.loads(
                run_cli(
                    "cluster", "--connect", cluster.daemons["node-a"].address, "--json"
                ).stdout.splitlines()[2]
            )["state"]
            == "down"
        ),
        10,
        "node-c listed as down",
    )
    assert states["node-a"] == "up"
