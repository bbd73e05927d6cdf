"""/metrics of a real daemon (mounted, Tier 2 on the filesystem), scraped over HTTP."""

from __future__ import annotations

import pathlib
import urllib.error
import urllib.request

import pytest

from gateway.client.sync import SyncClient
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
