"""``segment-gateway serve``: the daemon's lifecycle.

Start: open Tier 2 (starting the embedded S3 server if configured) and check
that it answers, recover the container from the journal, start the storage
writer, mount the segments at ``fuse.mountpoint`` (unless it is ""), listen,
then tell systemd ``READY=1`` (and write ``--ready-file``). While running:
``WATCHDOG=1`` from the event loop at half ``WATCHDOG_USEC`` (a stuck loop
stops the pings, and systemd restarts the service), a ``STATUS=`` line every
few seconds, and on SIGHUP a reload of the log level and the flush/offload
policy between ``RELOADING=1`` and ``READY=1``, connections untouched.

Stop (SIGTERM or SIGINT), in DESIGN.md's order, after ``STOPPING=1``: stop
accepting connections, stop reading new requests and answer the ones in
flight (at most ``server.drain_timeout``), unmount, flush unflushed data to
Tier 2 (at most ``tier2.stop_flush_timeout``), then close the container (a
final checkpoint) and the journal, the storage writer and the embedded S3
server, and exit 0. Nothing acknowledged depends on the stop finishing: it
is in the journal already, and a bound that is hit only means the next start
replays more and flushes the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import resource
import signal
import socket
import ssl
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

import trio

from gateway import failpoints
from gateway.aio import service_nursery
from gateway.client.client import Client, client_ssl_context, open_client
from gateway.cluster.claims import NameClaims
from gateway.cluster.lease import Lease, claim_epoch
from gateway.cluster.registry import UP
from gateway.cluster.view import ClusterView
from gateway.config import Config, Tier2Config
from gateway.container.container import SegmentContainer
from gateway.errors import GatewayError, Unavailable
from gateway.fsck.online import live_target
from gateway.metrics import GatewayCollector, MetricsServer
from gateway.node import Node, give_back_memory, open_node
from gateway.notify import Notifier
from gateway.replication.replicator import Replicator
from gateway.replication.store import ReplicaStore
from gateway.server import Server
from gateway.status import StatusPage
from gateway.storage.layer import ChunkLayer
from gateway.tier2.bindings import open_tier2
from gateway.tier2.storage_writer import StorageWriter

log = logging.getLogger(__name__)

STATUS_INTERVAL = 5.0
#: Tier-2 keys a reload applies (the storage writer reads them as it goes).
RELOADABLE_TIER2 = frozenset(
    {
        "flush_size",
        "flush_interval",
        "max_chunk_size",
        "flush_concurrency",
        "snapshot_interval",
        "snapshots_kept",
        "gc_interval",
        "gc_grace",
        "stop_flush_timeout",
        "defrag",
        "defrag_min_chunks",
        "defrag_small",
        "defrag_rate",
        "defrag_interval",
        "defrag_concurrency",
    }
)


def _write_ready_file(path: pathlib.Path, text: str) -> None:
    """Atomically publish ``text`` (the bound address) for scripts and tests."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def unflushed_bytes(container: SegmentContainer, writer: StorageWriter | None) -> int:
    """Bytes not yet in Tier 2: from the storage writer's segments waiting for a
    flush (without Tier 2, every segment's)."""
    if writer is not None:
        return writer.unflushed_bytes()
    return sum(s.length - max(s.storage_length, s.start_offset) for s in container.segments())


def status_line(container: SegmentContainer, writer: StorageWriter | None = None) -> str:
    """What ``systemctl status`` shows: segments, unflushed bytes, journal size."""
    unflushed = unflushed_bytes(container, writer)
    journal = container.journal_statistics()
    return (
        f"{container.segment_count} segments, {unflushed / 2**20:.1f} MiB pending flush, "
        f"journal {journal.disk_bytes / 2**20:.1f} MiB in {journal.files} file(s)"
    )


def raise_fd_limit() -> int:
    """Raise the soft file descriptor limit to the hard one; log and return what is in force.

    A daemon started from a shell gets its soft limit (often 1024), far below
    what the hard limit (and systemd's LimitNOFILE) allow: every client
    connection, journal file, RocksDB table and Tier-2 socket is a
    descriptor. The server bounds connections by what is left
    (`gateway.server.fd_connection_limit`).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        # Linux refuses "unlimited"; its ceiling is fs.nr_open.
        try:
            target = int(pathlib.Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            target = soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as e:
            log.warning("file descriptors: cannot raise the limit %d to %d: %s", soft, target, e)
            return soft
        log.info("file descriptors: limit %d, raised from %d (the hard limit)", target, soft)
        return target
    log.info("file descriptors: limit %d (the hard limit is %d)", soft, hard)
    return soft


def advertise_address(config: Config, host: str, port: int) -> str:
    """``node.advertise``, or the address the protocol listens on."""
    if config.node.advertise:
        return config.node.advertise
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
        log.warning("cluster: server.listen is a wildcard address and node.advertise is not "
                    "set; other nodes are told %s:%d", host, port)  # fmt: skip
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def node_ssl_context(config: Config) -> ssl.SSLContext | None:
    """TLS to the other nodes when this one serves TLS (a cluster speaks one way).

    Their certificates are checked against ``cluster.tls_ca`` (else
    ``server.tls_client_ca``, else the system's CAs) and must name the host
    of their ``node.advertise``; this node's own certificate goes along, for
    nodes that ask for one (``server.tls_client_ca``).
    """
    s = config.server
    if not s.tls_cert:
        return None
    return client_ssl_context(
        config.cluster.tls_ca or s.tls_client_ca or None, cert_file=s.tls_cert, key_file=s.tls_key
    )


def peer_timeout(config: Config) -> float:
    """How long connecting to another node, or one request to it, may take."""
    return max(2.0, min(10.0, config.cluster.down_after / 2))


def _connect_node(
    config: Config, ssl_context: ssl.SSLContext | None, address: str
) -> AbstractAsyncContextManager[Client]:
    """A protocol connection to another node, with this cluster's token (and TLS)."""
    return open_client(
        address,
        config.server.token,
        f"segment-gateway-node/{config.node.id}",
        ssl_context=ssl_context,
        connect_timeout=peer_timeout(config),
    )


def handovers(config: Config) -> bool:
    """Whether this node's container can move to another node and back (it is
    recovered from the replicas, and a lease bounds the old process)."""
    return config.replication.write_quorum > 1 and lease_duration(config) > 0


def _handed_over(life: _Lifecycle, node: str, claimant: str, takeover: bool) -> None:
    """Another node claimed this container: a drain, its own node taking it back, or a
    takeover of this process while it was cut off (then it leaves as `TakenOver`, which
    a supervisor starts again, and that start takes the container back)."""
    log.warning("handover: node %s claimed this container (node %s)%s; stopping cleanly so "
                "that it continues there", claimant, node,
                " in a takeover" if takeover else "")  # fmt: skip
    if takeover:
        # Not in `leave`: that list says the fence was applied (`_fenced`), and
        # the fence this claim implies must still be applied when it comes.
        life.taken_over = Unavailable(f"node {claimant} took its container over")
    life.handed_over = claimant
    life.stop()  # the ordered stop: answers in flight, "stopped"


def takes_over(config: Config) -> bool:
    """Whether this node runs down nodes' containers: only where nothing acknowledged is
    lost by it (a replicated journal) and a lease bounds the old process."""
    return config.cluster.takeover and handovers(config)


def lease_duration(config: Config) -> float:
    """The node's lease: none with an embedded Tier 2 (no other node can reach it)."""
    return 0.0 if config.tier2.url == "embedded" else config.cluster.lease


async def _claim(config: Config, tier2: ChunkLayer, notifier: Notifier, epoch: int) -> Lease:
    """Register this start's epoch (refused if taken over, copied or running elsewhere)."""
    cl = config.cluster
    return await claim_epoch(
        tier2,
        config.node.id,
        epoch,
        str(config.journal_dir),
        lease=lease_duration(config),
        down_after=cl.down_after,
        heartbeat_interval=cl.heartbeat_interval,
        status=notifier.status,
    )


@dataclasses.dataclass(frozen=True)
class Hosting:
    """This process runs another node's container on ``host``'s host.

    See `gateway.cluster.failover`.
    """

    #: The node whose host runs this process.
    host: str
    #: The host other nodes reach it at ("": the address listened on).
    advertise_host: str = ""
    #: A takeover: the epoch that died (the recovery refuses if it is no
    #: longer current). None: restarted from its own journal.
    takeover_of: int | None = None
    #: The host's replica store directory: a recovery copies what the host's
    #: own disk holds of the journal from there ("": all over the protocol).
    replicas: str = ""


async def _recover(
    config: Config,
    tier2: ChunkLayer,
    notifier: Notifier,
    expect_epoch: int | None = None,
    hosting: Hosting | None = None,
) -> None:
    """``--recover-from-tier2``: the journal from the replicas if the node replicated,
    else the metadata rebuilt from Tier 2. ``expect_epoch``: refuse unless it is
    the node's current epoch (a takeover of that epoch). ``hosting``: its host's
    own disk may hold a copy of the journal, read first."""
    from gateway.recovery.metadata_io import rebuild_node

    if expect_epoch is not None:
        # A planned move (drain, handback): the process running it stops
        # cleanly first (a dead one is waited for no longer than down_after).
        from gateway.cluster.handover import announce_waiting, wait_stopped

        # A drained process keeps serving until this one is started (a drain's
        # claim asks for that): the writers' pause starts only now.
        await announce_waiting(tier2, config.node.id, expect_epoch)
        await wait_stopped(config, tier2, config.node.id, expect_epoch, notifier.status)
    if config.replication.write_quorum > 1:
        from gateway.replication.recovery import LocalReplicas, recover_from_replicas

        local = None
        if hosting is not None and hosting.replicas:
            local = LocalReplicas(hosting.host, pathlib.Path(hosting.replicas))
        notifier.status("recovering the journal from its replicas")
        found = await recover_from_replicas(
            config,
            tier2,
            partial(_connect_node, config, node_ssl_context(config)),
            patience=max(5.0, 2 * config.replication.peer_timeout),
            status=notifier.status,
            expect_epoch=expect_epoch,
            local_replicas=local,
        )
        if found is not None:
            return
        log.warning("recovery: no ensemble record of node %s in Tier 2 (it never replicated); "
                    "rebuilding from Tier 2", config.node.id)  # fmt: skip
    if expect_epoch is not None:
        from gateway.cluster.fence import NodeFenced, current_epoch

        current = await current_epoch(tier2, config.node.id)
        if current != expect_epoch:
            raise NodeFenced(config.node.id, expect_epoch, current)
    notifier.status("recovering the metadata from Tier 2")
    await rebuild_node(config, tier2, status=notifier.status)


def _replicator(
    config: Config,
    tier2: ChunkLayer,
    node: Node,
    leave: list[GatewayError] | None,
    life: _Lifecycle | None = None,
) -> Replicator:
    return Replicator(
        config.node.id,
        node.journal,
        config.replication,
        tier2,
        partial(_connect_node, config, node_ssl_context(config)),
        on_fenced=partial(_fenced, node, leave=leave, life=life),
        record_deadline=min(config.tier2.retry_deadline, 10.0),
    )


def _up_peers(cluster: ClusterView) -> list[tuple[str, str]]:
    """Other nodes that are up, and where they listen: the ensemble's candidates.

    Not those on this node's own host (a container hosted here, or this
    container's host): a copy there dies with the copy on this disk.
    """
    mine = cluster.hosted_by or cluster.node_id
    return [
        (n, r.advertise)
        for n, r in cluster.records.items()
        if n != cluster.node_id
        and cluster.state_of(n) == UP
        and r.advertise
        and r.domain != mine
        and not r.hosted_by  # its host's disk: already counted, or this one
    ]


async def _epoch_current(tier2: ChunkLayer, source: str, epoch: int) -> bool:
    """Whether no epoch above ``epoch`` of ``source`` is registered (a takeover)."""
    from gateway.cluster.fence import current_epoch

    return await current_epoch(tier2, source, deadline=5.0) <= epoch


def _fenced(
    node: Node,
    error: GatewayError,
    leave: list[GatewayError] | None = None,
    life: _Lifecycle | None = None,
) -> None:
    """Another process took this node id over: stop changing anything anyone trusts.

    ``leave`` (containers that move between nodes): the first error is kept
    there and the process stops; `run_daemon` then exits with `TakenOver`, so
    that a supervisor starts it again and it takes its container back.
    """
    if leave is not None and leave:
        return
    node.container.fence(error)
    if node.storage_writer is not None:
        node.storage_writer.fence(error)
    if leave is None:
        log.error("cluster: %s. This process accepts no more changes and uploads nothing to "
                  "Tier 2; stop it", error)  # fmt: skip
        return
    leave.append(error)
    log.error("cluster: %s. This process accepts no more changes and stops; started again, "
              "it takes its container back (cluster.handback)", error)  # fmt: skip
    if life is not None:
        life.stop()
    else:
        os.kill(os.getpid(), signal.SIGTERM)


class TakenOver(GatewayError):
    """node {}'s container was taken over by another node while this process was cut \
off ({}); it stopped. Started again, it takes its container back (cluster.handback)"""

    exit_code = 48


async def _maintain_claims(claims: NameClaims, container: SegmentContainer, config: Config) -> None:
    """Claim segments made before names were claimed (once); retry failed releases.

    Every create since claims its name first, so once the node's segments
    have been claimed (``<data_dir>/cluster-claims`` names the Tier 2 they
    were claimed in) a start has nothing to claim.
    """
    marker = pathlib.Path(config.node.data_dir) / "cluster-claims"
    try:
        done = marker.read_text().strip() == config.tier2.url
    except OSError:
        done = False
    if not done:
        try:
            conflicts = await claims.claim_existing(
                [s.name for s in container.segments() if not s.hidden]
                + [st.name for st in container.list_streams()]
            )
        except GatewayError as e:
            log.warning("cluster: cannot claim the names of this node's segments: %s", e)
        else:
            for name, other in conflicts:
                log.error("cluster: segment %r exists here, but node %s holds its name; "
                          "rename or delete one of them", name, other)  # fmt: skip
            marker.write_text(config.tier2.url + "\n")

    def exists(name: str) -> bool:
        try:
            container.info(name)
        except GatewayError:
            return False
        return True

    while True:
        await trio.sleep(config.cluster.heartbeat_interval)
        await claims.retry_releases(exists)


def _progress(node: Node) -> tuple[int, int]:
    """(segments, unflushed bytes) for the heartbeat."""
    container = node.container
    return container.segment_count, unflushed_bytes(container, node.storage_writer)


async def check_tier2(tier2: ChunkLayer, config: Config) -> None:
    """Fail the start if Tier 2 does not answer (after the usual retries).

    Lists the node's metadata snapshots: a few objects at most, and a listing
    (unlike a HEAD) tells a missing bucket from a missing object.
    """
    from gateway.storage import object_keys as names

    await tier2.list(names.meta_prefix(config.node.id))


class _Lifecycle:
    """The running daemon's parts that signals act on."""

    def __init__(self, config: Config, notifier: Notifier) -> None:
        self.config = config
        self.notifier = notifier
        self.mount_scope: trio.CancelScope | None = None
        self.mount_done = trio.Event()
        #: The node this container is being handed over to ("": none).
        self.handed_over = ""
        #: Why this process leaves as `TakenOver` though no fence reached it yet
        #: (a failover's claim on its epoch; None: not taken over).
        self.taken_over: GatewayError | None = None
        self._stop_sent = False

    def stop(self) -> None:
        """Stop as at SIGTERM, once: a second SIGTERM of its own (a handover, then the
        fence it implies) would outlive the signal receiver and kill the process."""
        if not self._stop_sent:
            self._stop_sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    async def run_mount(
        self, node: Node, cluster: ClusterView, *, task_status: trio.TaskStatus[Any]
    ) -> None:
        from fs.mount import serve_mount  # pyfuse3 only when mounting
        from fs.segment_source import ClusterSegments, LocalSegments

        local = LocalSegments(node.container, node.reader, self.config.node.id)
        try:
            with trio.CancelScope() as scope:
                self.mount_scope = scope
                await serve_mount(
                    ClusterSegments(local, cluster), self.config, task_status=task_status
                )
        finally:
            self.mount_done.set()

    async def unmount(self) -> None:
        if self.mount_scope is not None:
            self.mount_scope.cancel()
            await self.mount_done.wait()

    async def watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        if interval is None:
            return
        pings = 0
        while True:
            self.notifier.watchdog()
            pings += 1
            if pings == 5:
                failpoints.hit("watchdog_ping_5")
            await trio.sleep(interval)

    async def report_status(self, node: Node) -> None:
        while True:
            await trio.sleep(STATUS_INTERVAL)
            self.notifier.status(status_line(node.container, node.storage_writer))

    def reload(self, load: Callable[[], Config], node: Node) -> None:
        """SIGHUP: apply the log level and the flush/offload policy of the file now."""
        container = node.container
        self.notifier.reloading()
        try:
            new = load()
        except GatewayError as e:
            log.error("reload: keeping the running configuration: %s", e)
            self.notifier.ready(status_line(container, node.storage_writer))
            return
        logging.getLogger().setLevel(new.logging.level.upper())
        old_t2, new_t2 = self.config.tier2, new.tier2
        keep = {
            f.name: getattr(old_t2, f.name)
            for f in dataclasses.fields(Tier2Config)
            if f.name not in RELOADABLE_TIER2
        }
        applied = dataclasses.replace(new_t2, **keep)
        if node.storage_writer is not None:
            node.storage_writer.reconfigure(applied)
        changed = [
            f"{section.name}.{f.name}"
            for section in dataclasses.fields(Config)
            for f in dataclasses.fields(getattr(new, section.name))
            if getattr(getattr(new, section.name), f.name)
            != getattr(getattr(self.config, section.name), f.name)
        ]
        restart = [
            k
            for k in changed
            if k != "logging.level" and not (k.startswith("tier2.") and k[6:] in RELOADABLE_TIER2)
        ]
        self.config = dataclasses.replace(new, tier2=applied)
        log.info("reloaded: %s", ", ".join(changed) or "nothing changed")
        if restart:
            log.warning("reload: %s take effect at the next start", ", ".join(restart))
        self.notifier.ready(status_line(container, node.storage_writer))


async def run_daemon(
    config: Config,
    ready_file: pathlib.Path | None = None,
    load: Callable[[], Config] | None = None,
    notifier: Notifier | None = None,
    recover_from_tier2: bool = False,
    hosting: Hosting | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down in order.

    ``load`` re-reads the configuration at SIGHUP (without it, SIGHUP only
    logs that there is nothing to reload). ``recover_from_tier2``: this node
    has lost its journal; rebuild its metadata from Tier 2 first
    (`gateway.recovery.metadata_io.rebuild_node`; refused unless the journal
    directory is empty). ``hosting``: this process runs another node's
    container on a surviving node's host (`gateway.cluster.failover`).
    """
    notifier = notifier or Notifier()
    life = _Lifecycle(config, notifier)
    raise_fd_limit()
    if recover_from_tier2:
        from gateway.recovery.metadata_io import ensure_empty

        ensure_empty(config.journal_dir)  # before starting anything
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with open_tier2(config) as tier2:
            await check_tier2(tier2, config)
            expect = hosting.takeover_of if hosting is not None else None
            if hosting is None and config.tier2.url != "embedded":
                from gateway.cluster.handover import check_not_retired

                await check_not_retired(tier2, config.node.id)
            if not recover_from_tier2 and hosting is None and handovers(config):
                from gateway.cluster.handover import take_back

                # Hosted elsewhere since this node was down or drained: get it
                # back (its own journal is stale and is set aside).
                expect = await take_back(config, tier2, notifier.status)
                recover_from_tier2 = expect is not None
            if recover_from_tier2:
                await _recover(config, tier2, notifier, expect, hosting)
            # Refused if this node id was taken over (a higher epoch), if its
            # epoch is another process's (a copied data directory), or while
            # another process of it still runs; waits out a previous lease.
            # Fenced (taken over while cut off), a container that can move stops
            # and exits TakenOver, to be started again and take it back.
            leave: list[GatewayError] | None = [] if handovers(config) else None
            async with open_node(
                config, tier2, partial(_claim, config, tier2, notifier),
                replicated=config.replication.write_quorum > 1,
            ) as node:  # fmt: skip
                container = node.container
                lease = container.lease
                assert isinstance(lease, Lease)
                replicator = None
                if config.replication.write_quorum > 1:
                    # Changes wait for the replicas from the start: not one is
                    # acknowledged on this disk alone (`Replicator.check`).
                    replicator = _replicator(config, tier2, node, leave, life)
                    container.lease = replicator
                if recover_from_tier2 and node.storage_writer is not None:
                    # The rebuilt metadata is the base every later recovery and
                    # follower must use, before anything a fenced process left.
                    await node.storage_writer.upload_snapshot(whole=True)
                cluster = ClusterView(
                    config,
                    tier2,
                    node.reader,
                    partial(_connect_node, config, node_ssl_context(config)),
                    partial(_progress, node),
                    partial(_fenced, node, leave=leave, life=life),
                    lease,
                )
                claims = None
                if config.tier2.url != "embedded":
                    # An embedded Tier 2 is this node's alone: its names are too.
                    claims = NameClaims(
                        tier2,
                        config.node.id,
                        node.journal.epoch,
                        address_of=cluster.address_of,
                        deadline=min(config.tier2.retry_deadline, 10.0),
                    )
                replicas = None
                if config.tier2.url != "embedded" and hosting is None:
                    # Every node of a cluster may hold others' journals (not a
                    # container hosted on another node's host: that host's disk).
                    replicas = ReplicaStore(
                        config.node.id, pathlib.Path(config.node.data_dir) / "replicas",
                        config.journal,
                    )  # fmt: skip
                    await trio.to_thread.run_sync(replicas.open)
                cluster.replicas = replicas
                cluster.hosted_by = hosting.host if hosting is not None else ""
                server = Server(
                    container,
                    config.server,
                    config.container.max_append_bytes,
                    node=config.node.id,
                    fsck_target=partial(
                        live_target,
                        container,
                        node.store,
                        node.storage_writer,
                        node.reader,
                        name_claims=claims,
                    ),
                    cluster=cluster,
                    claims=claims,
                    replicas=replicas,
                    epoch_current=partial(_epoch_current, tier2),
                )
                async with service_nursery() as nursery:
                    if replicas is not None:
                        await nursery.start(replicas.run)
                    # What /metrics, the status page and the status request read.
                    collector = GatewayCollector(node)
                    collector.cluster = cluster
                    collector.claims = claims
                    collector.server = server
                    page = StatusPage(collector)
                    server.summarize = page.summary
                    if config.metrics.listen:
                        metrics = MetricsServer(collector, config.metrics.listen)
                        metrics.page = page.answer
                        await nursery.start(metrics.serve)
                        nursery.start_soon(page.run)
                    if config.fuse.mountpoint:
                        collector.fs = await nursery.start(life.run_mount, node, cluster)
                    addresses = await nursery.start(server.serve)
                    host, port = addresses[0]
                    advertise = advertise_address(config, host, port)
                    if hosting is not None and hosting.advertise_host:
                        advertise = f"{hosting.advertise_host}:{port}"
                    await nursery.start(cluster.run, advertise, node.journal.epoch)
                    if handovers(config):
                        from gateway.cluster.handover import watch_handover

                        nursery.start_soon(
                            watch_handover, tier2, config.node.id, node.journal.epoch,
                            hosting.host if hosting is not None else config.node.id,
                            config.cluster.heartbeat_interval,
                            partial(_handed_over, life, config.node.id),
                        )  # fmt: skip
                    containers = None
                    if hosting is None and takes_over(config):
                        from gateway.cluster.failover import ContainerHost

                        containers = ContainerHost(
                            config, tier2, lambda: cluster.records, cluster.state_of,
                            cluster.liveness.age, cluster.liveness.watched,
                        )  # fmt: skip
                        await nursery.start(containers.run)
                        server.containers = containers
                        collector.containers = containers
                    if replicator is not None:
                        replicator.attach_candidates(partial(_up_peers, cluster))
                        await nursery.start(replicator.run)
                        collector.replicator = replicator
                    collector.replicas = replicas
                    server.replicator = replicator
                    # What starting parsed and built (the mount's tree too) and
                    # let go of goes back to the system before serving.
                    await trio.to_thread.run_sync(give_back_memory)
                    log.info("ready: %d segment(s), listening on %s:%d",
                             container.segment_count, host, port)  # fmt: skip
                    if ready_file is not None:
                        _write_ready_file(ready_file, f"{host}:{port}\n")
                    notifier.ready(status_line(container, node.storage_writer))
                    if claims is not None:
                        nursery.start_soon(_maintain_claims, claims, container, config)
                    nursery.start_soon(life.watchdog)
                    nursery.start_soon(life.report_status, node)
                    async for signum in signals:
                        if signum != signal.SIGHUP:
                            log.info("received %s: shutting down", signal.Signals(signum).name)
                            break
                        if load is None:
                            log.info("received SIGHUP: no configuration file to reload")
                        else:
                            life.reload(load, node)
                    notifier.stopping("stopping: draining connections")
                    if containers is not None and containers.hosted:
                        # Each flushes and says "stopped"; another node takes
                        # it over if this one is not back within down_after.
                        notifier.stopping("stopping: the containers hosted here")
                        await containers.stop()
                    await _stop(life, server, node)
                    nursery.cancel_scope.cancel()
    notifier.close()
    log.info("stopped")
    if leave or life.taken_over is not None:
        raise TakenOver(config.node.id, leave[0] if leave else life.taken_over)


async def _stop(life: _Lifecycle, server: Server, node: Node) -> None:
    """The ordered part of the stop; each step bounded, none able to lose data."""
    config = life.config
    container = node.container
    server.stop_accepting()
    server.stop_reading()
    with trio.move_on_after(config.server.drain_timeout) as scope:
        await server.wait_connections_closed()
    if scope.cancelled_caught:
        log.warning(
            "%d connection(s) still busy after %.0fs; closing them",
            len(server.connections),
            config.server.drain_timeout,
        )
    life.notifier.stopping("stopping: unmounting")
    await life.unmount()
    timeout = config.tier2.stop_flush_timeout
    replicator = server.replicator
    if timeout > 0 and life.handed_over:
        # The next host recovers the journal from the replicas anyway: a
        # flush here would only make the writers wait longer.
        log.info("stop: handing over to node %s; not flushing to Tier 2 (it recovers the "
                 "journal from the replicas)", life.handed_over)  # fmt: skip
        timeout = 0
    if timeout > 0 and container.fenced is not None:
        # Another process runs this container now: Tier 2 is its to write.
        log.info("stop: fenced (%s); not flushing to Tier 2", container.fenced)
        timeout = 0
    if timeout > 0 and replicator is not None and not replicator.has_quorum():
        # A flush is recorded in the journal, and nothing is recorded without
        # an ack quorum: waiting would only use up the timeout.
        log.warning("stop: no ack quorum of replicas (%s): not flushing to Tier 2; the "
                    "journal keeps the data", replicator.describe_quorum())  # fmt: skip
        timeout = 0
    if timeout > 0 and container.storage is not None:
        life.notifier.stopping("stopping: flushing to Tier 2")
        with trio.move_on_after(timeout) as scope:
            try:
                await container.flush()
                if node.storage_writer is not None:
                    # Other nodes show a stopped node's segments from its
                    # newest snapshot: make it name everything just flushed.
                    await node.storage_writer.upload_snapshot()
            except GatewayError as e:
                log.warning("stop: flush to Tier 2 failed (the journal keeps the data): %s", e)
        if scope.cancelled_caught:
            log.warning(
                "stop: flush to Tier 2 not done after %.0fs (tier2.stop_flush_timeout); "
                "the journal keeps the rest",
                timeout,
            )
    life.notifier.stopping("stopping: checkpoint")
