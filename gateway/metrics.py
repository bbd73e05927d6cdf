"""Prometheus metrics on ``metrics.listen`` (loopback by default).

Nothing on the hot paths knows about Prometheus: components keep plain
counters, ``statistics()`` and `gateway.stats.Histogram`s, and a collector
reads them when ``/metrics`` is scraped, in the event loop (so it sees a
consistent state and needs no locks). The endpoint is a few lines of HTTP on
trio rather than prometheus_client's threaded server, for the same reason.

One endpoint per machine: the containers of other nodes hosted here after a
takeover or drain (`gateway.cluster.failover`) run as child processes, each
with its own endpoint on loopback (port 0; it writes the bound address to
ADDRESS_FILE in its directory). A scrape here fetches theirs at the same
time, each within HOSTED_SCRAPE_TIMEOUT, and serves their series with a
``container`` label naming the node whose container they are; this node's
own series keep the labels they have without hosting (no ``container``).
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.config import METRICS_ADDRESS_FILE, parse_host_port
from gateway.health_metrics import health_families
from gateway.stats import Histogram

if TYPE_CHECKING:
    from fs.operations import SegmentFS
    from gateway.cluster.claims import NameClaims
    from gateway.cluster.failover import ContainerHost
    from gateway.cluster.view import ClusterView
    from gateway.node import Node
    from gateway.replication.replicator import Replicator
    from gateway.replication.store import ReplicaStore
    from gateway.server import Server

log = logging.getLogger(__name__)

PREFIX = "segment_gateway"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: An endpoint bound to port 0 writes its HOST:PORT here, in its node's data
#: directory (how a host finds its hosted containers' endpoints).
ADDRESS_FILE = METRICS_ADDRESS_FILE
#: Seconds a scrape waits for each hosted container's /metrics (all fetched
#: at once); one that has not answered by then is left out of that scrape.
HOSTED_SCRAPE_TIMEOUT = 1.0
#: A hosted container's /metrics larger than this is left out (it is ~50 KB).
MAX_HOSTED_BYTES = 8 * 1024 * 1024
#: The label that names the node whose container a hosted series is from.
CONTAINER_LABEL = "container"


def _histogram(name: str, doc: str, h: Histogram, labels: dict[str, str] | None = None) -> Metric:
    family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), h.cumulative(), h.sum)
    return family


class GatewayCollector(Collector):
    """Reads every component's counters at scrape time."""

    def __init__(self, node: Node) -> None:
        self.node = node
        #: The mount, once it is up (None without one).
        self.fs: SegmentFS | None = None
        #: This node's view of the cluster (None: not started yet).
        self.cluster: ClusterView | None = None
        #: Cluster-wide name claims (None with an embedded Tier 2).
        self.claims: NameClaims | None = None
        #: This node's journal's replication, and the replicas it holds (None: none).
        self.replicator: Replicator | None = None
        self.replicas: ReplicaStore | None = None
        #: Other nodes' containers run here after a takeover (None: takes none over).
        self.containers: ContainerHost | None = None
        #: The protocol server, once it is made (its requests by kind).
        self.server: Server | None = None
        #: Fetches of a hosted container's /metrics that failed or timed out, by node.
        self.hosted_failures: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        """One scrape of this node alone (no hosted containers)."""
        return self.merged({})

    def merged(self, hosted: dict[str, list[Metric]]) -> Iterator[Metric]:
        """This node's families with the hosted containers' series (``hosted``: node ->
        its families, as fetched by `scrape_hosted`) merged in, each family once.

        A hosted family of another type than this node's of the same name (a
        hosted process of another version) is left out.
        """
        extra = _by_name(hosted)
        for family in self._own():
            more = extra.pop(family.name, None)
            if more is not None and more.type == family.type:
                family.samples.extend(more.samples)
            yield family
        yield from extra.values()
        if self.containers is not None:
            up = GaugeMetricFamily(
                f"{PREFIX}_hosted_metrics_up",
                "1 when this scrape included the hosted container's metrics",
                labels=[CONTAINER_LABEL],
            )
            for node, hs in sorted(self.containers.statistics().hosted.items()):
                if hs.state == "serving":
                    up.add_metric([node], int(node in hosted))
            yield up
            failures = CounterMetricFamily(
                f"{PREFIX}_hosted_metrics_failures",
                "Fetches of a hosted container's metrics that failed or timed out "
                "(its series were left out of that scrape)",
                labels=[CONTAINER_LABEL],
            )
            for node, n in sorted(self.hosted_failures.items()):
                failures.add_metric([node], n)
            yield failures

    async def scrape_hosted(self) -> dict[str, list[Metric]]:
        """The families of every serving hosted container, fetched at once, each
        labelled with its node; one that fails or takes longer than
        HOSTED_SCRAPE_TIMEOUT is left out and counted in ``hosted_failures``."""
        if self.containers is None:
            return {}
        targets = {
            node: hs.metrics_address
            for node, hs in self.containers.statistics().hosted.items()
            if hs.state == "serving" and hs.metrics_address
        }
        got: dict[str, list[Metric]] = {}

        async def one(node: str, address: str) -> None:
            try:
                with trio.fail_after(HOSTED_SCRAPE_TIMEOUT):
                    body = await fetch_metrics(address)
                    got[node] = await trio.to_thread.run_sync(
                        _labelled, node, body, abandon_on_cancel=True
                    )
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError) as e:
                self.hosted_failures[node] = self.hosted_failures.get(node, 0) + 1
                why = (
                    f"no answer within {HOSTED_SCRAPE_TIMEOUT:g}s"
                    if isinstance(e, trio.TooSlowError)
                    else str(e) or type(e).__name__
                )
                log.warning("metrics: node %s's container (hosted here, %s) left out of this "
                            "scrape: %s", node, address, why)  # fmt: skip

        async with trio.open_nursery() as nursery:
            for node, address in sorted(targets.items()):
                nursery.start_soon(one, node, address)
        return got

    def _own(self) -> Iterator[Metric]:
        c = self.node.container
        g, counter = GaugeMetricFamily, CounterMetricFamily
        yield counter(f"{PREFIX}_appends", "Appends made durable", value=c.appends)
        yield counter(f"{PREFIX}_append_bytes", "Bytes appended (durable)", value=c.append_bytes)
        yield _histogram(
            "append_ack_seconds",
            "From validating an append to its being durable (the ack)",
            c.append_latency,
        )
        yield g(f"{PREFIX}_segments", "Live segments", value=c.segment_count)
        yield g(f"{PREFIX}_sealed_segments", "Sealed segments", value=c.sealed_count)

        st = c.statistics()
        yield g(f"{PREFIX}_streams", "Streams", value=st["streams"])
        yield counter(f"{PREFIX}_stream_rolls", "Stream segments sealed by rolling", value=c.rolls)
        yield g(
            f"{PREFIX}_transactions_open",
            "Transactions begun and not yet committed or aborted",
            value=st["transactions_open"],
        )
        txns = CounterMetricFamily(
            f"{PREFIX}_transactions", "Transactions by outcome", labels=["outcome"]
        )
        txns.add_metric(["begun"], c.txn_begun)
        txns.add_metric(["committed"], c.txn_committed)
        txns.add_metric(["aborted"], c.txn_aborted)
        txns.add_metric(["timed_out"], c.txn_timed_out)
        yield txns
        yield counter(
            f"{PREFIX}_retention_deleted_segments",
            "Stream segments deleted by retention",
            value=c.retention_deleted_segments,
        )
        yield counter(
            f"{PREFIX}_retention_deleted_bytes",
            "Bytes removed by retention (deleted segments and truncations)",
            value=c.retention_deleted_bytes + c.retention_truncated_bytes,
        )

        checkpoints = counter(
            f"{PREFIX}_checkpoints",
            "Checkpoints journaled: whole (every segment) or rolling (the changes and a share)",
            labels=["kind"],
        )
        checkpoints.add_metric(["whole"], c.full_checkpoints)
        checkpoints.add_metric(["rolling"], c.checkpoints - c.full_checkpoints)
        yield checkpoints
        yield counter(
            f"{PREFIX}_checkpoint_records",
            "Segment records in checkpoints",
            value=c.checkpoint_records,
        )
        yield counter(
            f"{PREFIX}_checkpoint_bytes", "Bytes of checkpoints journaled", value=c.checkpoint_bytes
        )
        yield g(
            f"{PREFIX}_cold_segments",
            "Segments kept as their record only, at the last cooling pass",
            value=c.cold_segments,
        )

        j = c.journal_statistics()
        yield g(f"{PREFIX}_epoch", "Epoch of this run of the daemon", value=j.epoch)
        yield g(f"{PREFIX}_journal_bytes", "Journal bytes on disk", value=j.disk_bytes)
        yield g(f"{PREFIX}_journal_files", "Journal files", value=j.files)
        yield g(f"{PREFIX}_journal_failed", "1 once the journal failed", value=int(bool(j.failed)))
        yield g(
            f"{PREFIX}_journal_short_of_space",
            "1 while the journal's disk is full (client changes wait; flushes use the reserve)",
            value=int(j.short_of_space),
        )
        yield g(
            f"{PREFIX}_journal_reserve_bytes",
            "Disk space held back for flush records and checkpoints",
            value=j.reserve_bytes,
        )
        yield counter(
            f"{PREFIX}_journal_refusals",
            "Journal write groups refused for want of disk space or descriptors",
            value=j.refusals,
        )
        journal = self.node.journal
        yield _histogram(
            "journal_fdatasync_seconds", "Journal fdatasync latency", journal.sync_latency
        )
        yield _histogram(
            "journal_group_bytes", "Bytes per journal write group", journal.group_bytes
        )

        cache = self.node.store.statistics()
        yield counter(f"{PREFIX}_cache_hits", "Cache hits (Tier-2 blocks)", value=cache.hits)
        yield counter(f"{PREFIX}_cache_misses", "Cache misses (Tier-2 blocks)", value=cache.misses)
        yield counter(f"{PREFIX}_cache_evictions", "Blocks evicted", value=cache.evictions)
        cache_bytes = g(f"{PREFIX}_cache_bytes", "Bytes in the cache", labels=["kind"])
        cache_bytes.add_metric(["pinned"], cache.pinned_bytes)
        # Unflushed bytes read back from the journal files (not copied into the cache).
        cache_bytes.add_metric(["journal"], self.node.read_index.located_bytes)
        cache_bytes.add_metric(["block"], cache.block_bytes)
        yield cache_bytes
        yield g(f"{PREFIX}_cache_budget_bytes", "Cache budget", value=cache.budget_bytes)

        if self.server is not None:
            requests = CounterMetricFamily(
                f"{PREFIX}_requests", "Protocol requests taken, by kind", labels=["kind"]
            )
            for kind, n in sorted(self.server.requests.items()):
                requests.add_metric([kind], n)
            yield requests

        yield from self._tier2()
        yield from self._embedded_s3()
        yield from self._fuse()
        yield from self._cluster()
        yield from self._replication()
        yield from self._failover()
        yield from health_families(self.node.journal.directory, self.server)

    def _tier2(self) -> Iterator[Metric]:
        writer = self.node.storage_writer
        if writer is None:
            return
        layer = writer.layer.statistics()
        requests = CounterMetricFamily(
            f"{PREFIX}_tier2_requests", "Tier-2 requests (retries included)", labels=["operation"]
        )
        for op, n in sorted(layer.requests_by_operation.items()):
            requests.add_metric([op], n)
        yield requests
        yield CounterMetricFamily(
            f"{PREFIX}_tier2_retries", "Tier-2 attempts retried", value=layer.retries
        )
        yield CounterMetricFamily(
            f"{PREFIX}_tier2_errors", "Tier-2 operations failed for good", value=layer.failures
        )
        latency = HistogramMetricFamily(
            f"{PREFIX}_tier2_request_seconds",
            "Tier-2 operation latency, retries included",
            labels=["operation"],
        )
        for op, h in sorted(writer.layer.latency.items()):
            latency.add_metric([op], h.cumulative(), h.sum)
        yield latency
        w = writer.statistics()
        yield GaugeMetricFamily(
            f"{PREFIX}_pending_flush_bytes", "Bytes not yet in Tier 2", value=w.unflushed_bytes
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_pending_flush_oldest_seconds",
            "Age of the oldest byte not yet in Tier 2",
            value=writer.oldest_unflushed_age(),
        )
        yield CounterMetricFamily(
            f"{PREFIX}_tier2_flushed_bytes", "Bytes flushed to Tier 2", value=w.bytes_flushed
        )
        yield CounterMetricFamily(
            f"{PREFIX}_tier2_flush_failures", "Flushes that failed", value=w.flush_failures
        )
        uploads = CounterMetricFamily(
            f"{PREFIX}_tier2_snapshots",
            "Metadata snapshots uploaded to Tier 2: whole ones, and deltas of the last whole one",
            labels=["kind"],
        )
        sizes = CounterMetricFamily(
            f"{PREFIX}_tier2_snapshot_bytes", "Bytes of the metadata snapshots uploaded",
            labels=["kind"],
        )  # fmt: skip
        keeper = writer.housekeeping
        for kind in ("whole", "delta"):
            uploads.add_metric([kind], keeper.snapshot_uploads[kind])
            sizes.add_metric([kind], keeper.snapshot_bytes[kind])
        yield uploads
        yield sizes
        yield CounterMetricFamily(
            f"{PREFIX}_tier2_snapshot_failures", "Metadata snapshot uploads that failed",
            value=keeper.snapshot_failures,
        )  # fmt: skip
        o = writer.optimizer.statistics()
        yield CounterMetricFamily(
            f"{PREFIX}_defrag_runs",
            "Runs of small chunks merged by the optimizer",
            value=o.runs_merged,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_defrag_chunks_replaced",
            "Chunks replaced by merged ones (objects deleted after tier2.gc_grace)",
            value=o.chunks_replaced,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_defrag_objects_deleted",
            "Replaced chunk objects deleted by the optimizer",
            value=o.objects_deleted,
        )
        defrag_bytes = CounterMetricFamily(
            f"{PREFIX}_defrag_bytes",
            "Bytes of merged chunks, by how Tier 2 got them",
            labels=["how"],
        )
        defrag_bytes.add_metric(["copied"], o.bytes_copied)
        defrag_bytes.add_metric(["reuploaded"], o.bytes_reuploaded)
        yield defrag_bytes
        yield CounterMetricFamily(
            f"{PREFIX}_defrag_failures", "Merges that failed (retried later)", value=o.failures
        )
        ai = writer.attributes.statistics()
        lookups = CounterMetricFamily(
            f"{PREFIX}_attribute_index_lookups",
            "Attribute values looked up in attribute indexes, by where the pages were",
            labels=["path"],
        )
        lookups.add_metric(["memory"], ai.inline_lookups)
        lookups.add_metric(["worker"], ai.lookups - ai.inline_lookups)
        yield lookups
        pages = CounterMetricFamily(
            f"{PREFIX}_attribute_index_page_reads",
            "Attribute index pages read, by source",
            labels=["source"],
        )
        pages.add_metric(["rocksdb"], ai.rocksdb_page_hits)
        pages.add_metric(["tier2"], ai.tier2_page_reads)
        yield pages
        yield CounterMetricFamily(
            f"{PREFIX}_attribute_index_batches",
            "Attribute index batches written",
            value=ai.batches,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_attribute_index_batch_bytes",
            "Bytes of attribute index pages written",
            value=ai.batch_bytes,
        )
        c = self.node.container
        yield CounterMetricFamily(
            f"{PREFIX}_attributes_loaded",
            "Attribute values brought into memory from attribute indexes",
            value=c.attributes_loaded,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_attributes_evicted",
            "Indexed attribute values dropped from memory (container.max_attributes)",
            value=c.attributes_evicted,
        )

    def _embedded_s3(self) -> Iterator[Metric]:
        from gateway.embedded import STATES

        writer = self.node.storage_writer
        if writer is None or writer.layer.embedded is None:
            return
        s = writer.layer.embedded.statistics()
        name = f"{PREFIX}_embedded_s3"
        up = int(s.state == "up")
        yield GaugeMetricFamily(f"{name}_up", "1 while the embedded S3 server serves", value=up)
        state = GaugeMetricFamily(
            f"{name}_state",
            "The embedded S3 server's state (1 for the current one)",
            labels=["state"],
        )
        for each in STATES:
            state.add_metric([each], int(s.state == each))
        yield state
        yield CounterMetricFamily(
            f"{name}_exits", "Exits of the embedded S3 server nobody asked for", value=s.exits
        )
        yield CounterMetricFamily(
            f"{name}_restarts", "Restarts that brought it back after such an exit", value=s.restarts
        )
        yield CounterMetricFamily(
            f"{name}_restart_attempts",
            "Restart attempts, failed ones included",
            value=s.restart_attempts,
        )
        if s.last_exit_status is not None:
            yield GaugeMetricFamily(
                f"{name}_last_exit_status",
                "Status of its last unasked-for exit (negative: killed by that signal)",
                value=s.last_exit_status,
            )

    def _failover(self) -> Iterator[Metric]:
        g, counter = GaugeMetricFamily, CounterMetricFamily
        h = self.containers
        if h is None:
            return
        st = h.statistics()
        hosted = g(
            f"{PREFIX}_hosted_container",
            "1 for each other node's container run on this host, by its state",
            labels=["node", "state"],
        )
        took = g(
            f"{PREFIX}_takeover_seconds",
            "How long the takeover (or drain) of a container hosted here took, from the "
            "decision to serving",
            labels=["node"],
        )
        for node, hs in sorted(st.hosted.items()):
            hosted.add_metric([node, hs.state], 1)
            if hs.takeover_seconds is not None:
                took.add_metric([node], hs.takeover_seconds)
        yield hosted
        yield took
        yield counter(
            f"{PREFIX}_takeovers", "Containers of down nodes taken over here", value=st.takeovers
        )
        yield counter(
            f"{PREFIX}_handovers",
            "Containers hosted here that stopped because their own node took them back "
            "(handback) or a drain moved them on",
            value=st.handbacks,
        )
        yield counter(
            f"{PREFIX}_takeover_failures",
            "Takeovers here whose recovery failed (tried again)",
            value=st.takeover_failures,
        )

    def _replication(self) -> Iterator[Metric]:
        g, counter = GaugeMetricFamily, CounterMetricFamily
        r = self.replicator
        if r is not None:
            st = r.statistics()
            yield g(
                f"{PREFIX}_replication_quorum",
                "1 while an ack quorum of this node's ensemble answers (appends can be acked)",
                value=int(st.has_quorum),
            )
            yield g(
                f"{PREFIX}_replication_ensemble_size",
                "Peers recorded in this node's ensemble",
                value=len(st.members),
            )
            yield counter(
                f"{PREFIX}_replication_ensemble_changes",
                "Ensemble changes recorded in Tier 2",
                value=st.ensemble_changes,
            )
            yield counter(
                f"{PREFIX}_replication_quorum_failures",
                "Changes answered NoQuorum (no ack quorum within replication.ack_timeout)",
                value=st.quorum_failures,
            )
            lag = g(
                f"{PREFIX}_replication_peer_lag_operations",
                "Journal operations written here and not yet durable on the peer",
                labels=["peer", "member"],
            )
            live = g(
                f"{PREFIX}_replication_peer_up",
                "1 while the peer answers replica writes",
                labels=["peer", "member"],
            )
            caught = g(
                f"{PREFIX}_replication_peer_caught_up",
                "1 once the peer's log holds this node's whole journal (it counts for acks)",
                labels=["peer", "member"],
            )
            errors = counter(
                f"{PREFIX}_replication_peer_errors",
                "Replica connections that failed or timed out",
                labels=["peer"],
            )
            for p in st.peers:
                member = str(int(p.member))
                lag.add_metric([p.node, member], p.lag)
                live.add_metric([p.node, member], int(p.live))
                caught.add_metric([p.node, member], int(p.caught_up))
                errors.add_metric([p.node], p.errors)
            yield lag
            yield live
            yield caught
            yield errors
        store = self.replicas
        if store is not None:
            rs = store.statistics()
            held = g(
                f"{PREFIX}_replicas_bytes",
                "Bytes of other nodes' journals held here",
                labels=["source"],
            )
            for source, (_, nbytes, _) in rs.sources.items():
                held.add_metric([source], nbytes)
            yield held
            yield counter(f"{PREFIX}_replica_writes", "Replica writes stored", value=rs.writes)
            yield counter(
                f"{PREFIX}_replica_write_bytes", "Replica bytes stored", value=rs.write_bytes
            )
            yield counter(
                f"{PREFIX}_replica_refusals",
                "Replica writes refused (fenced epochs, gaps, a full disk)",
                value=rs.refused,
            )

    def _cluster(self) -> Iterator[Metric]:
        view = self.cluster
        if view is None:
            return
        nodes = GaugeMetricFamily(
            f"{PREFIX}_cluster_nodes", "Nodes in the registry by state", labels=["state"]
        )
        states = [n.state for n in view.status()]
        for state in ("up", "down", "stopped"):
            nodes.add_metric([state], states.count(state))
        yield nodes
        remote = GaugeMetricFamily(
            f"{PREFIX}_cluster_remote_segments",
            "Other nodes' segments this node shows, and whether their tails can be read",
            labels=["node", "tail_available"],
        )
        for node in view.nodes.values():
            remote.add_metric([node.node_id, str(int(node.tail_available))], len(node.segments))
        yield remote
        follow = CounterMetricFamily(
            f"{PREFIX}_cluster_follow_requests",
            "Requests this node sent following another node's segments (full listings, "
            "records fetched after one, change-feed pages, pages of walks over all its records)",
            labels=["node", "kind"],
        )
        records = CounterMetricFamily(
            f"{PREFIX}_cluster_follow_feed_records",
            "Segment records another node's change feed brought",
            labels=["node"],
        )
        for node in view.nodes.values():
            follow.add_metric([node.node_id, "list"], node.listings)
            follow.add_metric([node.node_id, "get_record"], node.records_fetched)
            follow.add_metric([node.node_id, "changes"], node.feed_requests)
            follow.add_metric([node.node_id, "walk"], node.walk_pages)
            records.add_metric([node.node_id], node.feed_records)
        yield follow
        yield records
        yield GaugeMetricFamily(
            f"{PREFIX}_cluster_fenced",
            "1 once another process took this node id over",
            value=int(view.fenced is not None),
        )
        lease = view.lease
        yield GaugeMetricFamily(
            f"{PREFIX}_cluster_lease_held",
            "1 while this node may acknowledge changes (its lease is confirmed in Tier 2)",
            value=int(lease.held()),
        )
        if lease.enabled:
            yield GaugeMetricFamily(
                f"{PREFIX}_cluster_lease_remaining_seconds",
                "How long the lease holds without another confirmation",
                value=lease.remaining(),
            )
        yield CounterMetricFamily(
            f"{PREFIX}_cluster_lease_renewal_failures",
            "Lease confirmations that failed (Tier 2 unreachable or slow)",
            value=lease.failures,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_cluster_lease_refusals",
            "Changes refused or left unacknowledged for want of the lease",
            value=lease.refused,
        )
        rejected = CounterMetricFamily(
            f"{PREFIX}_tier2_records_rejected",
            "Records read from Tier 2 skipped as unusable (each version counted once)",
            labels=["kind"],
        )
        for kind, n in sorted(view.rejections.total.items()):
            rejected.add_metric([kind], n)
        yield rejected
        bad = GaugeMetricFamily(
            f"{PREFIX}_tier2_records_unusable",
            "Records in Tier 2 this node skips right now, by kind",
            labels=["kind"],
        )
        for kind, n in sorted(view.rejections.bad_now().items()):
            bad.add_metric([kind], n)
        yield bad
        if self.claims is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_name_claims",
                "Segment names claimed in Tier 2",
                value=self.claims.claimed,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_name_claims_refused",
                "Creates refused: another node holds the name",
                value=self.claims.refused,
            )

    def _fuse(self) -> Iterator[Metric]:
        fs = self.fs
        if fs is None:
            return
        ops = CounterMetricFamily(f"{PREFIX}_fuse_ops", "FUSE requests", labels=["operation"])
        for op, n in sorted(fs.ops.items()):
            ops.add_metric([op], n)
        yield ops
        stats = fs.statistics()
        for key, family, name, text in FUSE_FAMILIES:
            if key in stats:  # the passthrough ones only with passthrough on
                yield family(f"{PREFIX}_fuse_{name}", text, value=stats[key])


#: The mount's statistics() keys as metric families (kernel reads of segment files: none).
FUSE_FAMILIES: tuple[tuple[str, type[CounterMetricFamily | GaugeMetricFamily], str, str], ...] = (
    ("bytes_read", CounterMetricFamily, "read_bytes", "Bytes read through the mount"),
    ("read_errors", CounterMetricFamily, "read_errors", "Reads answered with EIO"),
    ("open_files", GaugeMetricFamily, "open_files", "Files open on the mount"),
    ("passthrough_opens", CounterMetricFamily, "passthrough_opens", "Opens read by the kernel"),
    ("backing_ids", GaugeMetricFamily, "backing_files", "Passthrough backing files held"),
    ("segment_files_bytes", GaugeMetricFamily, "segment_files_bytes", "Segment files' bytes"),
    ("segment_files_requested", CounterMetricFamily, "segment_files_requested", "Files asked for"),
    ("segment_files_made", CounterMetricFamily, "segment_files_made", "Segment files made"),
)


async def fetch_metrics(address: str) -> bytes:
    """The body of ``GET /metrics`` at ``address`` (HOST:PORT); ValueError unless 200.

    The endpoints here answer one request per connection and close it.
    """
    host, port = parse_host_port(address)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        received = bytearray()
        while data := await stream.receive_some(65536):
            received += data
            if len(received) > MAX_HOSTED_BYTES:
                raise ValueError(f"more than {MAX_HOSTED_BYTES} bytes")
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"answered {head[:80]!r}")
    return body


def _labelled(node: str, body: bytes) -> list[Metric]:
    """The gateway families in a hosted container's /metrics, every sample labelled
    ``container=node`` (ValueError if unparseable)."""
    try:
        families = list(text_string_to_metric_families(body.decode()))
    except (UnicodeDecodeError, IndexError, KeyError, TypeError) as e:
        raise ValueError(f"unparseable metrics: {e}") from None
    out = []
    for family in families:
        # Only this gateway's series: anything process-wide would clash with the host's.
        if not family.name.startswith(f"{PREFIX}_"):
            continue
        family.samples = [
            s._replace(labels={**s.labels, CONTAINER_LABEL: node}) for s in family.samples
        ]
        out.append(family)
    return out


def _by_name(hosted: dict[str, list[Metric]]) -> dict[str, Metric]:
    """The hosted containers' families merged by name (the first one's type and help)."""
    merged: dict[str, Metric] = {}
    for _, families in sorted(hosted.items()):
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)  # fmt: skip
            if into.type == family.type:
                into.samples.extend(family.samples)
    return merged


class _Scrape(Collector):
    """One scrape's families: the node's and its hosted containers' (`generate_latest`)."""

    def __init__(self, collector: GatewayCollector, hosted: dict[str, list[Metric]]) -> None:
        self.collector = collector
        self.hosted = hosted

    def collect(self) -> Iterable[Metric]:
        return self.collector.merged(self.hosted)


def _write_address(path: pathlib.Path, text: str) -> None:
    """Atomically publish the bound address (a reader never sees half of it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


#: Connections the metrics endpoint keeps open at once; a new one closes the oldest.
MAX_CONNECTIONS = 8
#: Seconds a connection has to send its request and take the answer.
REQUEST_TIMEOUT = 10.0


class MetricsServer:
    """``GET /metrics`` over HTTP/1.0-style one-request connections.

    At most MAX_CONNECTIONS are open at once, each for at most
    REQUEST_TIMEOUT: a new connection past the limit closes the oldest one,
    so idle sockets can neither take the daemon's file descriptors nor keep
    a scraper out for long (a scrape is over in milliseconds; only idle
    connections grow old).
    """

    def __init__(self, collector: GatewayCollector, listen: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.collector = collector
        self.listen = listen
        self.scrapes = 0
        #: What answers ``GET /`` and ``HEAD /`` (stream, head only): the status
        #: page's `gateway.status.StatusPage.answer` (None: 404 there).
        self.page: Callable[[trio.abc.Stream, bool], Awaitable[None]] | None = None
        #: Connections closed to make room for newer ones.
        self.evicted = 0
        #: Open connections, oldest first (dicts keep insertion order).
        self._open: dict[trio.CancelScope, None] = {}

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        """Listen on ``metrics.listen``; ``task_status.started`` gets the bound address."""
        host, port = parse_host_port(self.listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[:2]
        log.info("metrics on http://%s:%d/metrics", *bound)
        if port == 0:
            # Any free port: say which (a hosted container's host reads it).
            data_dir = pathlib.Path(self.collector.node.config.node.data_dir)
            address = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            _write_address(data_dir / ADDRESS_FILE, f"{address}:{bound[1]}\n")
        task_status.started((bound[0], bound[1]))
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        scope = trio.CancelScope(deadline=trio.current_time() + REQUEST_TIMEOUT)
        while len(self._open) >= MAX_CONNECTIONS:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.cancel()
            self.evicted += 1
        self._open[scope] = None
        try:
            async with stream:
                with scope:
                    await self._serve_one(stream)
        finally:
            self._open.pop(scope, None)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        try:
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 8192:
                data = await stream.receive_some(4096)
                if not data:
                    return
                request += data
            line = request.split(b"\r\n", 1)[0].split()
            if len(line) < 2 or line[0] not in (b"GET", b"HEAD"):
                await self._reply(stream, 405, b"only GET\n", "text/plain")
            elif line[1].split(b"?")[0] == b"/" and self.page is not None:
                await self.page(stream, line[0] == b"HEAD")
            elif line[1].split(b"?")[0] != b"/metrics":
                await self._reply(stream, 404, b"try /metrics\n", "text/plain")
            else:
                started = time.perf_counter()
                # The hosted containers' first (awaited, bounded); then this
                # node's, read in one go without yielding to the event loop.
                hosted = await self.collector.scrape_hosted()
                body = generate_latest(_Scrape(self.collector, hosted))
                self.scrapes += 1
                log.debug("scrape in %.1f ms", (time.perf_counter() - started) * 1000)
                await self._reply(stream, 200, body if line[0] == b"GET" else b"")
        except trio.BrokenResourceError:
            pass

    @staticmethod
    async def _reply(
        stream: trio.SocketStream, status: int, body: bytes, content_type: str = CONTENT_TYPE
    ) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
