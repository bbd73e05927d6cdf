"""A partitioned owner whose container another node took over (namespaces, veth, nft).

node-a runs in its own network namespace (tests/test_replication_partition.py,
`PartitionedCluster`, here with ``cluster.takeover = true``). Cut off from its
peers and from S3 while writers append, it acknowledges nothing; a survivor
takes its container over and the writers go on there; healed, the old process
finds itself fenced and stops (exit 48), and started again it takes its
container back. No node ever shows bytes another does not.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError
from tests.helpers.netns import NetNamespace
from tests.helpers.wait import wait_for
from tests.test_replication_partition import (
    EXPECTED,
    PartitionedCluster,
    Writer,
    check_read_back,
)
from tests.test_replication_partition import ns as ns  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(
    ns: NetNamespace, tmp_path: pathlib.Path, seaweedfs: EmbeddedS3
) -> Iterator[PartitionedCluster]:
    c = PartitionedCluster(tmp_path, seaweedfs, ns, takeover=True)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


def _hosted_by(address: str, node: str) -> str:
    with SyncClient(address) as c:
        return {n.id: n for n in c.cluster()}[node].hosted_by


@pytest.mark.expect_errors(
    *EXPECTED, "recover.*", "fenc.*", "taken over.*", "failover: .*", "handover: .*",
    "handback: .*",
)  # fmt: skip
def test_a_partitioned_owner_acknowledges_nothing_after_the_takeover_and_nothing_diverges(
    cluster: PartitionedCluster,
) -> None:
    old = cluster.daemons["node-a"]
    b, c = cluster.daemons["node-b"], cluster.daemons["node-c"]
    with cluster.client_a() as ca:
        ca.create("p")
        through_a = Writer(ca, "p")
        for _ in range(200):
            through_a.append()
        acked_before_cut = list(through_a.acked)
        cluster.ns.cut()
        cut_at = time.monotonic()
        # A survivor takes node-a's container over; meanwhile node-a acknowledges nothing.
        errors: list[GatewayError] = []

        def taken_over() -> bool:
            try:
                through_a.append()
            except GatewayError as e:
                errors.append(e)
            return _hosted_by(b.address, "node-a") in ("node-b", "node-c")

        wait_for(taken_over, 60, "node-a's container taken over by a survivor")
        took = time.monotonic() - cut_at
        host = _hosted_by(b.address, "node-a")
        # Writers go on through the survivors (redirected to the hosted container).
        with SyncClient(b.address) as cb:
            through_b = Writer(cb, "p")
            through_b.next = 100_000  # numbered apart from the lines written through node-a
            for _ in range(200):
                through_b.append()
        # The cut-off process still acknowledges nothing, however long it is asked.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                through_a.append()
            except GatewayError as e:
                errors.append(e)
                time.sleep(0.2)
        assert through_a.acked == acked_before_cut, "node-a acknowledged after the cut"
        assert errors
    print(f"taken over by {host} {took:.1f}s after the cut")

    # Healed: the old process finds itself fenced and stops (48); started again
    # (systemd would), it takes its container back.
    cluster.ns.heal()
    wait_for(lambda: not old.alive(), 60, "the fenced node-a to stop")
    assert old.proc is not None and old.proc.returncode == 48, old.log()
    old.start(timeout=180)
    wait_for(lambda: _hosted_by(b.address, "node-a") == "", 60, "node-a's container back home")

    attempted = through_a.attempted | through_b.attempted
    acked = through_a.acked + through_b.acked
    views = {}
    for name, address in (
        ("node-a", cluster.a_protocol.address), ("node-b", b.address), ("node-c", c.address),
    ):  # fmt: skip

        def settled(address: str = address, name: str = name) -> bool:
            with SyncClient(address) as cl:
                data = cl.read("p", 0, cl.info("p").length).data
            views[name] = data
            check_read_back(data, sorted(acked), attempted, f"via {name}")
            return True

        wait_for(settled, 60, f"every acknowledged line via {name}")
    # No divergent bytes: every node shows the same segment.
    assert views["node-a"] == views["node-b"] == views["node-c"]
    assert (old.data_dir / "journal.replaced").is_dir()
