"""One scrape target per machine: a host's /metrics shows the containers it hosts.

Three replicating daemons with ``cluster.takeover = true``; node-c is killed
with SIGKILL and a survivor runs its container as a child process. What the
operator's Prometheus, scraping the host's endpoint alone, then sees of
node-c's container: its appends, labelled ``container="node-c"``, beside the
host's own (unlabelled) series.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import trio

from gateway.client.client import open_client
from gateway.embedded import EmbeddedS3
from tests.helpers.daemon import scrape
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.wait import wait_for
from tests.test_failover_duties import EXPECTED_ERRORS, _first_append, _kill_holding_one_segment

pytestmark = pytest.mark.slow

P = "segment_gateway_"


@pytest.fixture
def cluster(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3) -> Iterator[ReplicatedCluster]:
    c = ReplicatedCluster(tmp_path, seaweedfs, takeover=True)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_the_hosts_metrics_show_the_hosted_containers_appends(
    cluster: ReplicatedCluster,
) -> None:
    """After kill -9 of node-c and its takeover, appends to node-c's segment through
    the new host show on the host's /metrics as node-c's container's
    (``appends_total{container="node-c"}``, the right count and bytes), not as the
    host's own; the other survivor shows none of node-c's series."""
    c = cluster
    host = await _kill_holding_one_segment(c)
    other = next(n for n in ("node-a", "node-b") if n != host)
    own_before = scrape(c.daemons[host].metrics_port).get(P + "appends_total", 0)

    appends = 5
    async with open_client(c.daemons[host].address) as cl:
        await _first_append(cl, "dead/x", b"-0")
        for i in range(1, appends):
            await cl.append("dead/x", b"-%d" % i)
        assert (await cl.read("dead/x", 0, 100)).data == b"before-0-1-2-3-4"

    port = c.daemons[host].metrics_port
    label = '{container="node-c"}'

    def shown() -> dict[str, float] | None:
        m = scrape(port)
        return m if m.get(P + "appends_total" + label) == appends else None

    m = await trio.to_thread.run_sync(
        lambda: wait_for(shown, 30, f"node-c's appends on {host}'s /metrics")
    )
    assert m[P + "append_bytes_total" + label] == 2 * appends
    assert m[P + 'append_ack_seconds_bucket{container="node-c",le="+Inf"}'] == appends
    assert m[P + "segments" + label] == 1
    assert m[P + "epoch" + label] >= 2  # the epoch it took over, and one more
    assert m[P + "hosted_metrics_up" + label] == 1
    assert m.get(P + "hosted_metrics_failures_total" + label, 0) == 0
    # The host's own series: as they were, without a label, not counting node-c's.
    assert m[P + "appends_total"] == own_before
    assert m[P + 'hosted_container{node="node-c",state="serving"}'] == 1
    # The other survivor runs nothing of node-c's.
    theirs = scrape(c.daemons[other].metrics_port)
    assert not any('container="node-c"' in k for k in theirs), theirs.keys()
