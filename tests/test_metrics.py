"""/metrics of a real daemon (mounted, Tier 2 on the filesystem), scraped over HTTP."""

from __future__ import annotations

import pathlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from types import SimpleNamespace

import pytest
import trio
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.client.sync import SyncClient
from gateway.cluster.failover import HostedStatistics, HostStatistics
from gateway.metrics import (
    ADDRESS_FILE,
    HOSTED_SCRAPE_TIMEOUT,
    GatewayCollector,
    MetricsServer,
    fetch_metrics,
)
from tests.helpers.daemon import scrape
from tests.helpers.mount import mounted_daemon

KiB = 1024


@pytest.mark.timeout(120)
def test_metrics_endpoint_reports_what_happened(tmp_path: pathlib.Path) -> None:
    config = f'[tier2]\nurl = "file://{tmp_path}/tier2"\n'
    with mounted_daemon(tmp_path, config) as daemon:
        with SyncClient(daemon.address) as c:
            c.create("m/s")
            for _ in range(10):
                c.append("m/s", b"x" * 10 * KiB)
            c.flush("m/s")
        assert (daemon.mnt / "m/s").read_bytes() == b"x" * 100 * KiB
        m = scrape(daemon.metrics_port)

        p = "segment_gateway_"
        assert m[p + "appends_total"] == 10
        assert m[p + "append_bytes_total"] == 100 * KiB
        assert m[p + "append_ack_seconds_count"] == 10
        assert m[p + 'append_ack_seconds_bucket{le="+Inf"}'] == 10
        assert m[p + "segments"] == 1
        assert m[p + "epoch"] == 1
        assert m[p + "journal_fdatasync_seconds_count"] >= 1
        assert m[p + "journal_group_bytes_sum"] >= 100 * KiB
        assert m[p + "journal_bytes"] > 0
        assert m[p + 'tier2_requests_total{operation="write"}'] >= 1
        assert m[p + 'tier2_request_seconds_count{operation="write"}'] >= 1
        assert m[p + "tier2_errors_total"] == 0
        assert m[p + "tier2_flushed_bytes_total"] == 100 * KiB
        assert m[p + "pending_flush_bytes"] == 0
        assert m[p + "pending_flush_oldest_seconds"] == 0
        assert m[p + 'cache_bytes{kind="pinned"}'] >= 0
        assert p + "cache_hits_total" in m and p + "cache_evictions_total" in m
        assert m[p + 'fuse_ops_total{operation="read"}'] >= 1
        assert m[p + 'fuse_ops_total{operation="lookup"}'] >= 1
        assert m[p + "fuse_read_bytes_total"] == 100 * KiB

        # Unflushed data shows up as pending (flush_interval is 10 s).
        with SyncClient(daemon.address) as c:
            c.append("m/s", b"y" * KiB)
        m = scrape(daemon.metrics_port)
        assert m[p + "pending_flush_bytes"] == KiB

        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/other", timeout=10)
        assert e.value.code == 404
        e.value.close()


#: What a hosted container's endpoint answers in the unit test below.
HOSTED_TEXT = b"""# HELP segment_gateway_appends_total Appends made durable
# TYPE segment_gateway_appends_total counter
segment_gateway_appends_total 7.0
# HELP segment_gateway_journal_bytes Journal bytes on disk
# TYPE segment_gateway_journal_bytes gauge
segment_gateway_journal_bytes 4096.0
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 12.0
"""


class _OwnOnly(GatewayCollector):
    """This node's series: only the append counter (no node behind it)."""

    def _own(self) -> Iterator[Metric]:
        yield CounterMetricFamily("segment_gateway_appends", "Appends made durable", value=3)


class _Host:
    """A `ContainerHost` as far as the metrics read it."""

    def __init__(self, hosted: dict[str, str]) -> None:
        self.hosted = hosted

    def statistics(self) -> HostStatistics:
        return HostStatistics(
            hosted={
                n: HostedStatistics("serving", "", 1.0, 0, address)
                for n, address in self.hosted.items()
            },
            takeovers=len(self.hosted),
            takeover_failures=0,
            handbacks=0,
        )


@pytest.mark.serial  # a wall-time bound of a second or two (tests/conftest.py)
@pytest.mark.timeout(30)
async def test_a_hung_hosted_container_does_not_stall_the_scrape(tmp_path: pathlib.Path) -> None:
    """The host's /metrics includes a hosted container's series, labelled with its
    node; one whose endpoint accepts and never answers is left out (and counted)
    after HOSTED_SCRAPE_TIMEOUT, the scrape answered all the same."""
    hung: list[trio.SocketStream] = []

    async def answering(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(4096)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            await stream.send_all(head % len(HOSTED_TEXT) + HOSTED_TEXT)

    async def hanging(stream: trio.SocketStream) -> None:
        hung.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        ok = (await nursery.start(partial(trio.serve_tcp, answering, 0, host="127.0.0.1")))[0]
        stuck = (await nursery.start(partial(trio.serve_tcp, hanging, 0, host="127.0.0.1")))[0]
        node = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(data_dir=tmp_path)))
        collector = _OwnOnly(node)  # type: ignore[arg-type]
        collector.containers = _Host(  # type: ignore[assignment]
            {
                "node-b": f"127.0.0.1:{ok.socket.getsockname()[1]}",
                "node-c": f"127.0.0.1:{stuck.socket.getsockname()[1]}",
            }
        )
        server = MetricsServer(collector, "127.0.0.1:0")
        host, port = await nursery.start(server.serve)
        # Bound to port 0: the address is in the data directory for a host to read.
        assert (tmp_path / ADDRESS_FILE).read_text() == f"127.0.0.1:{port}\n"

        for scrape_no in (1, 2):
            started = trio.current_time()
            body = await fetch_metrics(f"{host}:{port}")
            took = trio.current_time() - started
            assert HOSTED_SCRAPE_TIMEOUT <= took < HOSTED_SCRAPE_TIMEOUT + 1.0, took
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(body.decode())
                for s in f.samples
            }
            p = "segment_gateway_"
            assert samples[(p + "appends_total", ())] == 3  # this node's own, unlabelled
            assert samples[(p + "appends_total", (("container", "node-b"),))] == 7
            assert samples[(p + "journal_bytes", (("container", "node-b"),))] == 4096
            assert not any(name.startswith("process_") for name, _ in samples)
            of_c = {name for name, labels in samples if ("container", "node-c") in labels}
            assert of_c == {p + "hosted_metrics_up", p + "hosted_metrics_failures_total"}
            assert samples[(p + "hosted_metrics_up", (("container", "node-b"),))] == 1
            assert samples[(p + "hosted_metrics_up", (("container", "node-c"),))] == 0
            assert samples[(p + "hosted_metrics_failures_total", (("container", "node-c"),))] == (
                scrape_no
            )
            # Each family once: the hosted series are in this node's family.
            assert body.count(b"# TYPE segment_gateway_appends_total ") == 1
        assert hung  # it was asked
        nursery.cancel_scope.cancel()
