"""The replicated journal across a real network partition (namespaces, veth, nft).

node-a, the owner under test, runs in its own network namespace joined to the
root namespace by a veth pair; node-b, node-c and SeaweedFS stay in the root
namespace (SeaweedFS through a relay on the veth address, since node-a cannot
reach the root namespace's loopback). nftables rules in node-a's namespace
drop everything between it and the other nodes (and S3, in the second test),
both ways, while the test's own client reaches node-a from a second address
that is never cut. Replication as in tests/test_replication.py:
``write_quorum = 3, ack_quorum = 2, ack_timeout = 3s, peer_timeout = 1s``.
"""

from __future__ import annotations

import pathlib
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, Unavailable
from tests.helpers import netns
from tests.helpers.daemon import Daemon, scrape
from tests.helpers.netns import NetNamespace, TcpRelay
from tests.helpers.replicated import replicated_config
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ACK_TIMEOUT = 3.0

_unavailable: list[str | None] = []


@pytest.fixture
def ns() -> Iterator[NetNamespace]:
    """A fresh namespace, deleted (with its veth pair and rules) whatever happens."""
    if not _unavailable:
        _unavailable.append(netns.unavailable())
    if _unavailable[0] is not None:
        pytest.skip(f"no network namespaces here: {_unavailable[0]}")
    netns.sweep_stale()
    with NetNamespace() as n:
        yield n


class PartitionedCluster:
    """node-a inside ``ns``, node-b and node-c outside, all replicating on one bucket."""

    def __init__(
        self, root: pathlib.Path, s3: EmbeddedS3, ns: NetNamespace, takeover: bool = False
    ) -> None:
        from gateway.storage.s3 import S3Storage

        self.root = root
        self.s3 = s3
        self.ns = ns
        self.bucket = f"part-{uuid.uuid4().hex[:12]}"
        storage = S3Storage(
            self.bucket, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
            secret_key=s3.secret_key,
        )  # fmt: skip
        storage.create_bucket_if_missing()
        storage.close()
        self.env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        u = urlsplit(s3.endpoint_url)
        assert u.hostname is not None and u.port is not None
        self.relays: list[TcpRelay] = []
        #: SeaweedFS as node-a reaches it (the port a cut may leave open).
        self.s3_relay = self._relay(ns.host_ip, (u.hostname, u.port))
        self.daemons: dict[str, Daemon] = {}
        a_config = replicated_config(
            "node-a", self.bucket, f"http://{self.s3_relay.address}", takeover=takeover
        )
        self.daemons["node-a"] = Daemon(
            root / "node-a", a_config, env=self.env, host=ns.ns_ip, command_prefix=ns.exec_prefix
        )
        for n in ("node-b", "node-c"):
            config = replicated_config(n, self.bucket, s3.endpoint_url, takeover=takeover)
            self.daemons[n] = Daemon(root / n, config, env=self.env, host=ns.host_ip)
        a = self.daemons["node-a"]
        # The test's own way to node-a: from client_ip, never cut.
        self.a_protocol = self._relay("127.0.0.1", (ns.ns_ip, a.port), ns.client_ip)
        self.a_metrics = self._relay("127.0.0.1", (ns.ns_ip, a.metrics_port), ns.client_ip)

    def _relay(self, host: str, upstream: tuple[str, int], source: str | None = None) -> TcpRelay:
        relay = TcpRelay(host, upstream, source)
        self.relays.append(relay)
        return relay

    def start(self) -> None:
        for n in ("node-b", "node-c", "node-a"):
            self.daemons[n].start(timeout=90)
        for n in self.daemons:
            wait_for(lambda n=n: self.replicating(n), 60, f"{n}'s ensemble of 2 with a quorum")

    def metrics(self, node: str) -> dict[str, float]:
        if node == "node-a":
            return scrape(self.a_metrics.port)
        d = self.daemons[node]
        return scrape(d.metrics_port, d.host)

    def replicating(self, node: str) -> bool:
        m = self.metrics(node)
        return (
            m.get("segment_gateway_replication_ensemble_size", 0) >= 2
            and m.get("segment_gateway_replication_quorum", 0) == 1
        )

    def quorum(self, node: str) -> float | None:
        return self.metrics(node).get("segment_gateway_replication_quorum")

    def client_a(self) -> SyncClient:
        """A protocol client of node-a over the path no cut touches."""
        return SyncClient(self.a_protocol.address)

    def teardown(self) -> None:
        for d in self.daemons.values():
            d.stop(timeout=10)
        for r in self.relays:
            r.close()


@pytest.fixture
def cluster(
    ns: NetNamespace, tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> Iterator[PartitionedCluster]:
    # ns first: where namespaces cannot be made, skip before starting SeaweedFS.
    c = PartitionedCluster(tmp_path, seaweedfs, ns)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


def _line(i: int) -> bytes:
    return f"line {i:06d} ".encode() + bytes([97 + i % 26]) * (i % 200) + b"\n"


def check_read_back(data: bytes, acked: list[int], attempted: set[int], where: str) -> None:
    """``data`` is whole lines, each an attempted one, in order, none twice, every acked one."""
    lines = data.split(b"\n")
    assert lines[-1] == b"", f"{where}: ends inside a line"
    numbers = []
    for got in lines[:-1]:
        i = int(got.split()[1])
        assert got + b"\n" == _line(i), f"{where}: line {got[:40]!r} is damaged"
        numbers.append(i)
    assert numbers == sorted(set(numbers)), f"{where}: lines out of order or twice"
    assert set(numbers) <= attempted, f"{where}: lines nobody wrote"
    missing = sorted(set(acked) - set(numbers))
    assert not missing, f"{where}: acknowledged lines missing: {missing[:10]}"


class Writer:
    """Appends numbered lines to one segment, keeping what was acknowledged."""

    def __init__(self, client: SyncClient, segment: str) -> None:
        self.client = client
        self.segment = segment
        self.next = 0
        self.acked: list[int] = []
        self.attempted: set[int] = set()

    def append(self) -> None:
        """One line; acknowledged, or the error raised (the line counts as attempted)."""
        i = self.next
        self.next += 1
        self.attempted.add(i)
        self.client.append(self.segment, _line(i))
        self.acked.append(i)


EXPECTED = ("cluster: .*", "replication: .*", "connection .*", "tier2.*", "lease.*")


@pytest.mark.expect_errors(*EXPECTED)
def test_an_owner_cut_off_from_both_peers_acknowledges_nothing_until_healed(
    cluster: PartitionedCluster,
) -> None:
    """Peers unreachable (S3 still reachable): every append fails with NoQuorum after
    ack_timeout, the quorum metric is 0 and the log says so; healed, appends are
    acknowledged again, and every acknowledged line reads back in order."""
    a = cluster.daemons["node-a"]
    with cluster.client_a() as c:
        c.create("p")
        w = Writer(c, "p")
        for _ in range(200):
            w.append()

        cluster.ns.cut(allow_ports=[cluster.s3_relay.port])
        for _ in range(3):
            started = time.monotonic()
            # NoQuorum in the daemon; on the wire UNAVAILABLE, which the client raises.
            with pytest.raises(Unavailable) as e:
                w.append()
            took = time.monotonic() - started
            # Waited for the quorum (ack_timeout), then said why; not a hang.
            assert ACK_TIMEOUT - 0.5 <= took <= ACK_TIMEOUT + 10, took
            assert str(e.value).startswith("not acknowledged: "), e.value
            assert "replica(s) needed answer" in str(e.value), e.value
        wait_for(lambda: cluster.quorum("node-a") == 0, 15, "node-a's quorum metric at 0")
        assert cluster.metrics("node-a")["segment_gateway_replication_quorum_failures_total"] >= 3
        assert "replication: no ack quorum" in a.log_path.read_text()

        cluster.ns.heal()
        wait_for(lambda: cluster.quorum("node-a") == 1, 60, "node-a's quorum again")
        for _ in range(100):
            w.append()
        # Both peers hold its journal again.
        wait_for(lambda: cluster.replicating("node-a"), 60, "node-a's ensemble of 2 again")
        data = c.read("p", 0, c.info("p").length).data
    check_read_back(data, w.acked, w.attempted, "node-a after the heal")
    assert len(w.acked) == 300


@pytest.mark.expect_errors(*EXPECTED, "recover.*", "fenc.*", "taken over.*")
def test_an_owner_cut_off_from_everything_is_fenced_and_its_successor_has_every_ack(
    cluster: PartitionedCluster,
) -> None:
    """Cut off from peers and S3, the owner acknowledges nothing; a replacement takes its
    id over from the replicas with every acknowledged line; healed, the old owner is
    fenced at the replicas and still acknowledges nothing, and the new owner's data does
    not change."""
    old = cluster.daemons["node-a"]
    with cluster.client_a() as c:
        c.create("z")
        w = Writer(c, "z")
        for _ in range(300):
            w.append()
        cluster.ns.cut()
        for _ in range(2):
            with pytest.raises(Unavailable):
                w.append()
        acked_before_cut = list(w.acked)

        new = Daemon(
            cluster.root / "node-a-new",
            replicated_config("node-a", cluster.bucket, cluster.s3.endpoint_url),
            env=cluster.env,
            host=cluster.ns.host_ip,
        )
        try:
            new.start(timeout=120, serve_args=("--recover-from-tier2",))
            with SyncClient(new.address) as cn:
                taken = cn.read("z", 0, cn.info("z").length).data
            check_read_back(taken, w.acked, w.attempted, "the new node-a")

            cluster.ns.heal()
            # The old owner reaches its replicas again: they refuse it (fenced), and it
            # acknowledges nothing, however long it tries.
            errors: list[GatewayError] = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    w.append()
                except GatewayError as e:
                    errors.append(e)
                    if any(_fenced(x) for x in errors) and time.monotonic() > deadline - 10:
                        break
                    time.sleep(0.2)
            assert w.acked == acked_before_cut, "the old owner acknowledged after the takeover"
            assert any(_fenced(e) for e in errors), [str(e) for e in errors[-3:]]
            assert "fenced" in old.log_path.read_text() or "taken over" in old.log_path.read_text()
            # The new owner's data is what it recovered, and it goes on.
            with SyncClient(new.address) as cn:
                assert cn.read("z", 0, cn.info("z").length).data == taken
                cn.append("z", b"after the takeover\n")
                assert cn.read("z", 0, cn.info("z").length).data == taken + b"after the takeover\n"
        finally:
            new.stop(timeout=10)


def _fenced(e: GatewayError) -> bool:
    text = str(e)
    return "fenced" in text or "refuses" in text or "taken over" in text


@pytest.mark.expect_errors(*EXPECTED)
def test_an_owner_stopped_while_cut_off_stops_cleanly_and_keeps_every_ack(
    cluster: PartitionedCluster,
) -> None:
    """Two appends not acknowledged (cut off from both peers), then SIGTERM: the daemon
    stops in time, exit 0, its journal consistent; restarted and healed, every
    acknowledged line reads back (the unacknowledged ones may or may not)."""
    a = cluster.daemons["node-a"]
    with cluster.client_a() as c:
        c.create("s")
        w = Writer(c, "s")
        for _ in range(50):
            w.append()
        cluster.ns.cut(allow_ports=[cluster.s3_relay.port])
        for _ in range(2):
            with pytest.raises(Unavailable):
                w.append()
    started = time.monotonic()
    code = a.stop(timeout=60)
    took = time.monotonic() - started
    stop_log = a.log_path.read_text()
    cluster.ns.heal()
    a.start(timeout=90)
    wait_for(lambda: cluster.replicating("node-a"), 60, "node-a's ensemble of 2 again")
    with cluster.client_a() as c:
        check_read_back(c.read("s", 0, c.info("s").length).data, w.acked, w.attempted,
                        "node-a restarted")  # fmt: skip
    # Without an ack quorum the stop does not wait to flush (it could not be
    # recorded): it takes the drain and the checkpoint, not stop_flush_timeout.
    assert took < 15, took
    assert "not flushing to Tier 2" in stop_log
    assert code == 0, stop_log[-2000:]
    assert "inconsistent" not in stop_log, stop_log[-2000:]
