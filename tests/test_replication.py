"""The replicated journal against real daemons: a node's death loses nothing acknowledged.

Three daemons on one SeaweedFS bucket with ``write_quorum = 3, ack_quorum =
2``: every write group a node commits is on its own disk and on both
others', and an append is acknowledged once two copies are synced.
"""

from __future__ import annotations

import json
import pathlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.client.writer import open_segment_writer
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, NoQuorum
from tests.helpers.daemon import free_port, run_cli, scrape
from tests.helpers.disk import tmpfs
from tests.helpers.mount import MountedDaemon, force_unmount, require_fuse
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.s3proxy import S3FaultProxy
from tests.helpers.wait import async_wait_for, wait_for
from tests.torture import check_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3) -> Iterator[ReplicatedCluster]:
    c = ReplicatedCluster(tmp_path, seaweedfs)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


def _payload(i: int) -> bytes:
    return f"event {i:06d} ".encode() + bytes([65 + i % 26]) * (i % 300) + b"\n"


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_dead_disk_loses_nothing(cluster: ReplicatedCluster) -> None:
    """kill -9 a node and wipe its data dir: rebuilt from the replicas, every ack reads back."""
    acked: dict[str, bytearray] = {"logs/a": bytearray(), "logs/b": bytearray()}
    with cluster.client("node-a") as c:
        for name in acked:
            c.create(name)
        for i in range(400):
            name = "logs/a" if i % 3 else "logs/b"
            data = _payload(i)
            r = c.append(name, data)
            assert r.offset == len(acked[name])
            acked[name] += data
        c.flush("logs/a")  # part flushed, part only in the journal (and its replicas)
        for i in range(400, 700):
            data = _payload(i)
            c.append("logs/a", data)
            acked["logs/a"] += data
    a = cluster.daemons["node-a"]
    a.kill()
    cluster.destroy_data("node-a")
    a.start(timeout=90, serve_args=("--recover-from-tier2",))
    assert "recovered node node-a from replica" in a.log_path.read_text()
    with cluster.client("node-a") as c:
        for name, data in acked.items():
            assert c.info(name).length == len(data)
            assert c.read(name, 0, len(data)).data == bytes(data)
        # And it goes on taking appends, replicated again.
        c.append("logs/b", b"after\n")
    for node in cluster.daemons:
        cluster.wait_ensemble(node)
    # Who replicates whom, as an operator sees it -- once settled: a peer notices
    # at its next keepalive that the rebuilt node lost its replica log, and
    # node-a is out of its ensemble until caught up again.
    rows: dict[str, Any] = {}

    def settled() -> bool:
        r = run_cli("cluster", "--json", "--connect", a.address)
        rows.update({row["id"]: row for row in map(json.loads, r.stdout.splitlines())})
        return all(len(rows[n]["ensemble"]) == 2 for n in cluster.daemons) and (
            len(rows["node-a"]["replicas_of"]) == 2
        )

    wait_for(settled, 60, "every node's ensemble of two", detail=lambda: rows)
    assert sorted(rows["node-a"]["ensemble"]) == ["node-b", "node-c"]
    assert rows["node-a"]["quorum"] is True
    assert sorted(rows["node-a"]["replicas_of"]) == ["node-b", "node-c"], rows
    assert sorted(rows["node-b"]["ensemble"]) == ["node-a", "node-c"]
    text = run_cli("cluster", "--connect", a.address).stdout
    assert "REPLICATED TO" in text and "node-a holds replicas of: node-b, node-c" in text


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_a_restarted_node_sends_its_replicas_only_what_they_lack(
    cluster: ReplicatedCluster,
) -> None:
    """kill -9 and restart in place with 3 MiB unflushed: each peer begins the new
    epoch's log from its copy of the old one (seeded), not from the whole journal
    sent again; a rebuild from those logs has every acknowledged byte."""
    written = "segment_gateway_replica_write_bytes_total"
    acked = bytearray()
    with cluster.client("node-a") as c:
        c.create("big")
        for i in range(96):  # 3 MiB, none of it flushed (flush_interval 24h)
            data = (b"%06d " % i) * 4681 + b"\n"
            c.append("big", data)
            acked += data
    a = cluster.daemons["node-a"]
    a.kill()
    peers = ("node-b", "node-c")
    before = {n: scrape(cluster.daemons[n].metrics_port)[written] for n in peers}
    a.start(timeout=60)
    cluster.wait_ensemble("node-a")
    with cluster.client("node-a") as c:
        c.append("big", b"after\n")
        acked += b"after\n"
    sent = {n: scrape(cluster.daemons[n].metrics_port)[written] - before[n] for n in peers}
    assert all(v < 256 * 1024 for v in sent.values()), f"sent again after the restart: {sent}"
    text = a.log_path.read_text()
    assert text.count("seeds epoch 2's log from its epoch 1") == 2, a.log()
    # The seeded logs are whole: node-a rebuilt from them (a dead disk) has it all.
    a.kill()
    cluster.destroy_data("node-a")
    a.start(timeout=90, serve_args=("--recover-from-tier2",))
    assert "epoch 2, operations" in a.log_path.read_text(), a.log()
    with cluster.client("node-a") as c:
        assert c.info("big").length == len(acked)
        assert c.read("big", 0, len(acked)).data == bytes(acked)


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_below_ack_quorum_nothing_is_acknowledged(cluster: ReplicatedCluster) -> None:
    """Two replicas stopped: appends fail with NoQuorum after ack_timeout; one back: resume."""
    with cluster.client("node-a") as c:
        c.create("q")
        c.append("q", b"one\n")
        b, cc = cluster.daemons["node-b"], cluster.daemons["node-c"]
        assert b.proc is not None and cc.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        cc.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(GatewayError) as e:
                c.append("q", b"two\n")
            assert isinstance(e.value, NoQuorum) or "replica" in str(e.value)
        finally:
            b.proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: (
                scrape(cluster.daemons["node-a"].metrics_port).get(
                    "segment_gateway_replication_quorum"
                )
                == 1
            ),
            30,
            "quorum again",
        )
        c.append("q", b"three\n")
        cc.proc.send_signal(signal.SIGCONT)
        data = c.read("q", 0, 100).data
        # "two" was not acknowledged; it may or may not have become durable.
        assert data in (b"one\nthree\n", b"one\ntwo\nthree\n")


@pytest.fixture
def proxy(seaweedfs: EmbeddedS3) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(seaweedfs.endpoint_url) as p:
        yield p


class _Appender:
    """Appends lines to one segment in a thread, keeping what was acknowledged."""

    def __init__(self, client: SyncClient, segment: str) -> None:
        self.client = client
        self.segment = segment
        self.acked = bytearray()
        self.errors: list[GatewayError] = []
        self.acked_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            data = f"line {i:07d}\n".encode()
            try:
                self.client.append(self.segment, data)
            except GatewayError as e:
                self.errors.append(e)
                time.sleep(0.05)
                continue
            self.acked += data
            self.acked_at.append(time.monotonic())
            i += 1

    def __enter__(self) -> _Appender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*", "tier2.*", "lease.*")
def test_a_zombie_cut_off_from_s3_keeps_acking_until_fenced_at_the_replicas(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, proxy: S3FaultProxy
) -> None:
    """Cut off from S3 only, the owner keeps acknowledging (its replicas answer); once a
    takeover fences it at the replicas it acknowledges nothing more, and every byte it
    did acknowledge is on the new owner."""
    c = ReplicatedCluster(tmp_path, seaweedfs, endpoints={"node-a": proxy.endpoint_url})
    new = None
    try:
        c.start()
        with c.client("node-a") as first:
            first.create("z")
        zombie = SyncClient(c.daemons["node-a"].address)
        with zombie, _Appender(zombie, "z") as app:
            wait_for(lambda: len(app.acked) > 2000, 30, "appends before the cut")
            proxy.set_upstream(f"http://127.0.0.1:{free_port()}")
            proxy.drop(None)
            cut_at = time.monotonic()
            # Past the lease (2 s): still acknowledging, the replicas answer.
            wait_for(lambda: app.acked_at[-1] > cut_at + 3.0, 30, "acks after the cut")
            new = c.replacement("node-a")
            new.start(timeout=90, serve_args=("--recover-from-tier2",))
            fenced_at = time.monotonic()
            # The zombie learns at its next write; nothing is acknowledged after.
            wait_for(lambda: app.errors and app.acked_at[-1] < time.monotonic() - 1, 30,
                     "the zombie refused")  # fmt: skip
            last_ack = app.acked_at[-1]
            time.sleep(1.0)
            assert app.acked_at[-1] == last_ack
        # Refused as fenced, or -- its container able to move -- the fenced
        # process stopping under the writer (it exits 48, below).
        assert any("fenced" in str(e) or "refuses" in str(e) or "taken over" in str(e)
                   or "closed the connection" in str(e) or "cannot connect" in str(e)
                   or "reset by peer" in str(e)
                   for e in app.errors), app.errors[-3:]  # fmt: skip
        assert last_ack < fenced_at + 5
        zombie_process = c.daemons["node-a"]
        wait_for(lambda: not zombie_process.alive(), 30, "the fenced process to stop")
        assert zombie_process.proc is not None and zombie_process.proc.returncode == 48
        with SyncClient(new.address) as c2:
            data = c2.read("z", 0, c2.info("z").length).data
        # Every acknowledged byte is there, in order; at most writes never acked follow.
        assert data[: len(app.acked)] == bytes(app.acked)
    finally:
        if new is not None:
            new.stop(timeout=10)
        c.teardown()


@pytest.mark.expect_errors(
    "cluster: .*", "replication: .*", "connection .*",
    r"read of 'events/a' at offset \d+ \(\d+ bytes\) failed",
)  # fmt: skip
async def test_a_wiped_owner_keeps_every_event_for_writers_mounts_and_spark(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, spark: Any
) -> None:
    """An exactly-once writer appends through kill -9 of the owner and the loss of its
    disk; rebuilt from the replicas, every event is there once and in order: over the
    protocol from every node, through every node's mount, and in Spark."""
    require_fuse()
    c = ReplicatedCluster(tmp_path, seaweedfs, mounts=True)
    a = c.daemons["node-a"]
    events = 4000
    try:
        await trio.to_thread.run_sync(c.start)
        async with open_client(a.address) as cl:
            await cl.create("events/a", codec="lines")
        half = trio.Event()
        rebuilt = trio.Event()

        async def lose_the_disk() -> None:
            await half.wait()

            def crash() -> None:
                a.kill()
                force_unmount(a.data_dir.parent / "node-a-mnt")
                c.destroy_data("node-a")
                a.start(timeout=120, serve_args=("--recover-from-tier2",))

            await trio.to_thread.run_sync(crash)
            rebuilt.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lose_the_disk)
            async with open_segment_writer(
                a.address, "events/a", codec="lines", writer_id=uuid.uuid4().bytes,
                max_batch_bytes=2048, reconnect_timeout=300,
            ) as w:  # fmt: skip
                for i in range(events):
                    await w.write(b"event-%08d" % i)
                    if i == events // 2:
                        await w.flush()  # acknowledged on two disks, then the disk dies
                        half.set()
                    if i % 50 == 0:
                        await trio.sleep(0.01)
                await w.flush()
                assert w.acked_event == events
                duplicates = w.duplicates
        assert rebuilt.is_set()
        assert "recovered node node-a from replica" in a.log_path.read_text()

        def expected(i: int) -> bytes:
            return b"event-%08d" % i

        for node, d in c.daemons.items():

            async def by_protocol(d: Any = d, node: str = node) -> bool:
                # Another node follows the rebuilt owner within its refresh
                # (until then it shows what is flushed: a prefix).
                async with open_client(d.address) as cl:
                    info = await cl.info("events/a")
                    data = (await cl.read("events/a", 0, info.length)).data
                where = f"over the protocol via {node}"
                return check_lines(data, expected, 0, where, "events/a") == events

            await async_wait_for(by_protocol, 30, f"events/a over the protocol via {node}")
        # All in Tier 2 now: the other nodes' mounts (and Spark through one)
        # read it from the chunks, not from a tail read of an owner that is
        # busy catching up after its rebuild (a tail read that times out
        # shows the flushed length; docs/OPERATIONS.md, replication).
        async with open_client(a.address) as cl:
            await cl.flush("events/a")
        for node, d in c.daemons.items():

            def through_mount(d: Any = d, node: str = node) -> bool:
                # Another node's view follows the rebuilt owner within its refresh.
                data = (d.mnt / "events" / "a").read_bytes()
                return check_lines(data, expected, 0, f"through {node}'s mount", "events/a") == (
                    events
                )

            await trio.to_thread.run_sync(
                lambda f=through_mount, n=node: wait_for(f, 30, f"{n}'s mount")
            )
        uri = f"file://{c.daemons['node-b'].mnt}/events/a"
        want = [expected(i).decode() for i in range(events)]

        def in_spark() -> bool:
            values = [r.value for r in spark.read.text(uri).collect()]
            assert values == want[: len(values)], "Spark read something else than a prefix"
            return values == want

        await trio.to_thread.run_sync(lambda: wait_for(in_spark, 60, "every event in Spark"))
        del duplicates  # resends were recognised: none is stored twice (checked above)
    finally:
        await trio.to_thread.run_sync(c.teardown)


def _latencies(c: SyncClient, segment: str, seconds: float, size: int = 1024) -> list[float]:
    out = []
    data = b"x" * (size - 1) + b"\n"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        c.append(segment, data)
        out.append(time.monotonic() - began)
    return out


def _p99(xs: list[float]) -> float:
    return sorted(xs)[int(len(xs) * 0.99)]


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_a_stopped_replica_does_not_stall_the_writer(cluster: ReplicatedCluster) -> None:
    """SIGSTOP one replica: the other carries the acks; latency stays bounded, far below
    the peer timeout, and the stopped one catches up after SIGCONT."""
    stopped = cluster.daemons["node-c"]
    assert stopped.proc is not None
    with cluster.client("node-a") as c:
        c.create("lat")
        before = _latencies(c, "lat", 2.0)
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            during = _latencies(c, "lat", 4.0)
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
        length = c.info("lat").length
        assert length == 1024 * (len(before) + len(during))
    print(
        f"p99 before {_p99(before) * 1000:.1f} ms ({len(before)} appends), during "
        f"{_p99(during) * 1000:.1f} ms ({len(during)}), max {max(during) * 1000:.1f} ms"
    )
    # Bounded by the other replica, not by the stopped one (peer_timeout is 1 s).
    assert _p99(during) < 0.5
    assert len(during) >= len(before)  # twice as long: at least as many
    cluster.wait_ensemble("node-a")  # node-c back in, caught up


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*", "replicas: .*")
def test_a_full_replica_refuses_and_a_spare_takes_its_place(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> None:
    """Four nodes, node-b's replica disk tiny: it refuses, node-a's ensemble changes to the
    spare, and no append waits for the full one."""
    c = ReplicatedCluster(tmp_path, seaweedfs, nodes=("node-a", "node-b", "node-c", "node-d"))
    with tmpfs(c.daemons["node-b"].data_dir / "replicas", "4m"):
        try:
            c.start()
            metrics = c.daemons["node-a"].metrics_port
            with c.client("node-a") as cl:
                cl.create("big")
                blob = bytes(range(256)) * 1024  # 256 KiB
                slowest = 0.0
                for _ in range(40):  # 10 MiB: more than node-b's replicas can hold
                    began = time.monotonic()
                    cl.append("big", blob)
                    slowest = max(slowest, time.monotonic() - began)
                assert cl.info("big").length == 40 * len(blob)
            assert slowest < 3.0  # never the ack_timeout of a stalled quorum
            members = {
                k for k, v in scrape(metrics).items()
                if k.startswith("segment_gateway_replication_peer_up{") and 'member="1"' in k
            }  # fmt: skip

            def without_b() -> bool:
                m = scrape(metrics)
                ins = {k.split('peer="')[1].split('"')[0] for k, v in m.items()
                       if k.startswith("segment_gateway_replication_peer_caught_up{")
                       and 'member="1"' in k and v == 1}  # fmt: skip
                return len(ins) == 2 and "node-b" not in ins

            wait_for(without_b, 30, "node-a's ensemble without the full node-b")
            del members
            assert "replica disk full" in c.daemons["node-a"].log_path.read_text()
        finally:
            c.teardown()


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_replicas_are_truncated_with_the_source_journal(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> None:
    """A replica costs disk only for the unflushed backlog: once the source's data is in
    Tier 2 and its journal truncated, the replicas' copies of it go too."""
    small_journal = """file_size = "1 MiB"
preallocate_step = "256 KiB"
max_pending_bytes = "1 MiB"
max_group_bytes = "512 KiB"
max_frame_bytes = "256 KiB"
max_operation_bytes = "512 KiB"
checkpoint_every_frames = 5
"""
    small = """
[container]
max_append_bytes = "256 KiB"
[server]
max_message_bytes = "1 MiB"
"""
    c = ReplicatedCluster(tmp_path, seaweedfs, extra=small, journal=small_journal)
    try:
        c.start()
        held = 'segment_gateway_replicas_bytes{source="node-a"}'
        with c.client("node-a") as cl:
            cl.create("t")
            blob = b"y" * (64 * 1024 - 1) + b"\n"
            for _ in range(96):  # 6 MiB: six journal files and more
                cl.append("t", blob)
            peak = min(scrape(c.daemons[n].metrics_port)[held] for n in ("node-b", "node-c"))
            assert peak > 5 * 1024 * 1024
            cl.flush("t")
            for _ in range(8):  # checkpoints come with more frames; the files then go
                cl.append("t", b"z\n")
                cl.flush("t")

        def truncated() -> bool:
            return all(
                scrape(c.daemons[n].metrics_port)[held] < 2 * 1024 * 1024
                for n in ("node-b", "node-c")
            )

        wait_for(truncated, 60, "the replicas of node-a's journal truncated")
    finally:
        c.teardown()


@pytest.mark.expect_errors("cluster: .*", "replication: .*", "connection .*")
def test_a_dead_owners_unflushed_tail_is_read_from_the_replicas(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> None:
    """Read once, always readable: kill -9 the owner of an unflushed segment; another
    node's mount and protocol reads keep its whole length, served from that node's
    replica of the owner's journal, byte for byte."""
    require_fuse()
    c = ReplicatedCluster(tmp_path, seaweedfs, mounts=True)
    try:
        c.start()
        data = b"".join(b"tail line %06d\n" % i for i in range(3000))
        with c.client("node-a") as cl:
            cl.create("tail/a")
            cl.append("tail/a", data[:20000])
            cl.flush("tail/a")  # part in Tier 2, the rest only in journals
            cl.append("tail/a", data[20000:])
        b = c.daemons["node-b"]
        assert isinstance(b, MountedDaemon)
        path = b.mnt / "tail" / "a"
        wait_for(lambda: path.stat().st_size == len(data), 30, "node-b's view of tail/a")
        assert path.read_bytes() == data
        c.daemons["node-a"].kill()
        wait_for(lambda: "node-a" not in {n for n, _ in _up_nodes(b.address)}, 30, "node-a down")
        # Down: still the whole length, and the bytes, from the replica.
        assert path.stat().st_size == len(data)
        assert path.read_bytes() == data
        with SyncClient(b.address) as cl:
            assert cl.info("tail/a").length == len(data)
            assert cl.read("tail/a", 0, len(data)).data == data
    finally:
        c.teardown()


def _up_nodes(address: str) -> list[tuple[str, str]]:
    r = run_cli("cluster", "--json", "--connect", address)
    return [(row["id"], row["state"]) for row in map(json.loads, r.stdout.splitlines())
            if row["state"] == "up"]  # fmt: skip
