"""The listener: accepting connections, their bound, TLS, and the ordered stop.

File descriptors: connections are refused (LIMIT_EXCEEDED, then closed at
once) beyond ``server.max_connections`` or beyond what the descriptor limit
leaves after FD_RESERVE for the daemon's own files, whichever is lower, so
peers can never make the journal's next file fail to open.

Security (docs/SECURITY.md): with ``server.tls_cert`` each accepted stream
is wrapped in TLS (1.2 at least) and the handshake runs in the connection's
own task under a deadline, so a slow, plaintext or hostile peer only costs
its own connection. A listener that is not on loopback without a token (or
without TLS) is warned about loudly.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import resource
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from gateway.config import ServerConfig, parse_host_port
from gateway.config.tls import certificate_expiry
from gateway.container.container import SegmentContainer
from gateway.errors import LimitExceeded, ProtocolError
from gateway.fsck.report import FsckRecord
from gateway.protocol.framing import close_now

from .answers import error_response, framed
from .budget import MemoryBudget
from .connection import Connection
from .hello import HANDSHAKE_TIMEOUT

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims
    from gateway.cluster.failover import ContainerHost
    from gateway.cluster.view import ClusterView
    from gateway.fsck.checks import Target
    from gateway.protocol import wire_pb2 as wire
    from gateway.replication.replicator import Replicator
    from gateway.replication.store import ReplicaStore

log = logging.getLogger(__name__)

#: File descriptors kept for the daemon's own files besides those open when
#: serving starts: new journal files, RocksDB tables, Tier-2 sockets, the
#: metrics endpoint's connections, fsck.
FD_RESERVE = 128
#: Refused connections are logged at most once per this many seconds.
REFUSAL_LOG_INTERVAL = 10.0


def _is_loopback(host: str) -> bool:
    """Whether a listen host is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _tls_reason(e: BaseException) -> str:
    """OpenSSL's words for why a TLS stream broke (trio wraps them)."""
    cause = e.__cause__ or e.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause)
    return str(cause or e) or "connection closed during the handshake"


def fd_connection_limit(max_connections: int) -> tuple[int, str]:
    """How many connections the descriptor limit allows, and why (for the log).

    What is left of the soft RLIMIT_NOFILE after the descriptors open now
    (the journal, RocksDB, Tier 2, the mount, the metrics listener are all
    up when the server starts) and FD_RESERVE for what they open later.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections, "no file descriptor limit"
    try:
        in_use = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    except OSError:
        in_use = 64  # no /proc: a typical count at this point
    allowed = soft - in_use - FD_RESERVE
    why = f"file descriptors: limit {soft}, {in_use} in use, {FD_RESERVE} kept for the daemon"
    if allowed < 1:
        log.warning(
            "%s: no room left for client connections; serving one at a time. "
            "Raise the limit (LimitNOFILE= in the unit, ulimit -n)",
            why,
        )
        return 1, why
    return allowed, why


class Server:
    """Accepts connections and serves the protocol until cancelled."""

    def __init__(
        self,
        container: SegmentContainer,
        config: ServerConfig,
        max_append: int,
        node: str = "",
        fsck_target: Callable[[], Target] | None = None,
        cluster: ClusterView | None = None,
        claims: NameClaims | None = None,
        replicas: ReplicaStore | None = None,
        epoch_current: Callable[[str, int], Awaitable[bool]] | None = None,
    ) -> None:
        self.container = container
        #: Other nodes' journals held here (None: this node keeps no replicas).
        self.replicas = replicas
        #: Other nodes' containers run on this host (None: this node takes none over).
        self.containers: ContainerHost | None = None
        #: Requests taken since the start, by kind (wire.proto's Request.kind; Hello left out).
        self.requests: dict[str, int] = {}
        #: Whether a source's epoch is its current one in Tier 2 (before a log starts).
        self.epoch_current = epoch_current
        #: This node's journal's replication (None: not replicated), for the status.
        self.replicator: Replicator | None = None
        #: Other nodes and their segments (None: this node alone).
        self.cluster = cluster
        #: Cluster-wide name claims (None: names are this node's alone).
        self.claims = claims
        self.config = config
        #: ``node.id``, named in exported metadata snapshots.
        self.node = node
        #: The live state fsck checks (its Tier-2 parts included); without
        #: it, the container alone (no Tier 2 to check).
        self.fsck_target = fsck_target
        #: The node at a glance, for the status request (`gateway.status`; set by the daemon).
        self.summarize: Callable[[], Awaitable[wire.NodeSummary]] | None = None
        #: What the online fsck runs found (the ``fsck_*`` metrics).
        self.fsck_record = FsckRecord()
        #: TLS for every connection (None: plain TCP); ConfigError if the files do not load.
        self.ssl_context: ssl.SSLContext | None = config.ssl_context()
        #: When the certificate it serves expires (Unix time; None: no TLS), read with it.
        self.certificate_expiry = certificate_expiry(config.tls_cert) if config.tls_cert else None
        #: Seconds a client has to complete the TLS handshake, and then to send Hello.
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        #: TLS handshakes in progress, and those that failed or timed out.
        self.handshaking = 0
        self.handshake_failures = 0
        self.container_config_max_append = max_append
        self.connections: set[Connection] = set()
        self.accepted = 0
        #: What all connections together hold in memory (server.max_memory).
        self.memory = MemoryBudget(config.max_memory)
        #: Connections allowed at once: server.max_connections, or fewer if
        #: the file descriptor limit says so (set when serving starts).
        self.connection_limit = config.max_connections
        #: Sockets (TLS handshakes and connections) the descriptor limit allows.
        self.socket_limit = config.max_connections
        self._limit_reason = "server.max_connections"
        #: Connections closed because their peer stopped taking answers.
        self.stalled_closed = 0
        #: Connections refused for a limit, and when refusals were last logged.
        self.refused = 0
        self._refused_logged = 0
        self._next_refusal_log = -math.inf
        self._listeners: list[trio.SocketListener] = []
        self._accepting = trio.CancelScope()
        self._no_connections = trio.Event()
        self._no_connections.set()

    async def serve(self, *, task_status: trio.TaskStatus[list[tuple[str, int]]]) -> None:
        """Listen on ``server.listen``; ``task_status.started`` gets the bound addresses."""
        host, port = parse_host_port(self.config.listen)
        if not _is_loopback(host):
            self._warn_exposed()
        self._listeners = await trio.open_tcp_listeners(port, host=host)
        addresses = [tuple(lst.socket.getsockname()[:2]) for lst in self._listeners]
        log.info("serving the protocol on %s", ", ".join(f"{h}:{p}" for h, p in addresses))
        self._apply_fd_limit()
        task_status.started(addresses)
        async with trio.open_nursery() as watch:
            watch.start_soon(self._close_stalled_readers)
            # Connections carry on after accepting stops, and the watch with them.
            async with trio.open_nursery() as nursery:
                with self._accepting:
                    await trio.serve_listeners(
                        self._handle, self._listeners, handler_nursery=nursery
                    )
            watch.cancel_scope.cancel()

    async def _close_stalled_readers(self) -> None:
        """Close connections whose peer has not taken an answer for server.send_timeout.

        Their queued answers hold memory (``server.max_inflight_bytes`` each)
        that other clients may be waiting for. One look a second (or four
        per timeout, if it is short) costs less than a deadline per message.
        """
        timeout = self.config.send_timeout
        while True:
            await trio.sleep(min(1.0, timeout / 4))
            now = trio.current_time()
            for conn in list(self.connections):
                started = conn.messages.send_started
                if started is not None and now - started >= timeout:
                    log.info(
                        "connection %s: answers not taken for %.0fs (server.send_timeout); closing",
                        conn.peer,
                        now - started,
                    )
                    self.stalled_closed += 1
                    conn.abort()

    def _apply_fd_limit(self) -> None:
        """Bound connections by what the file descriptor limit leaves (logged)."""
        allowed, why = fd_connection_limit(self.config.max_connections)
        self.socket_limit = allowed
        self.connection_limit = min(self.config.max_connections, allowed)
        if allowed < self.config.max_connections:
            self._limit_reason = "the file descriptor limit; server.max_connections is " + str(
                self.config.max_connections
            )
        log.info(
            "connections: at most %d (server.max_connections %d; %s)",
            self.connection_limit,
            self.config.max_connections,
            why,
        )

    def _note_refusal(self, peer: str, what: str) -> None:
        """Count a refused connection; log at most once per REFUSAL_LOG_INTERVAL."""
        self.refused += 1
        now = trio.current_time()
        if now < self._next_refusal_log:
            return
        log.warning(
            "refusing connections: %s (%d refused since the last report, the latest from %s; "
            "reported at most every %.0fs)",
            what,
            self.refused - self._refused_logged,
            peer,
            REFUSAL_LOG_INTERVAL,
        )
        self._refused_logged = self.refused
        self._next_refusal_log = now + REFUSAL_LOG_INTERVAL

    def _limit_error(self) -> LimitExceeded:
        return LimitExceeded(f"{self.connection_limit} connections ({self._limit_reason})")

    async def _refuse(self, tcp: trio.SocketStream, peer: str, plaintext: bool) -> None:
        """Say LIMIT_EXCEEDED (when that costs nothing) and close at once."""
        e = self._limit_error()
        self._note_refusal(peer, str(e))
        try:
            if plaintext:
                with trio.move_on_after(1):
                    await tcp.send_all(framed(error_response(0, e)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            close_now(tcp)

    def _warn_exposed(self) -> None:
        """Say loudly what a non-loopback listener exposes without a token or TLS."""
        listen, tls = self.config.listen, self.ssl_context is not None
        if not self.config.token:
            log.warning(
                "server.listen is %s without server.token: ANYONE who can reach this port "
                "can read, write, truncate and delete EVERY segment%s. Set server.token "
                "(and server.tls_cert/server.tls_key), or listen on 127.0.0.1",
                listen,
                "" if tls else ", and the data crosses the network unencrypted",
            )
        elif not tls:
            log.warning(
                "server.listen is %s without TLS: the token and all segment data cross the "
                "network in clear text; anyone who can watch the traffic can steal the token. "
                "Set server.tls_cert and server.tls_key",
                listen,
            )

    def stop_accepting(self) -> None:
        """Close the listening sockets; established connections carry on."""
        self._accepting.cancel()

    def stop_reading(self) -> None:
        """Stop reading new requests on every connection; queued ones are answered."""
        for conn in list(self.connections):
            conn.reader_scope.cancel()

    async def _handshake(
        self, tcp: trio.SocketStream, peer: str
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS stream over ``tcp`` once the handshake is done; None if it failed."""
        assert self.ssl_context is not None
        tls = trio.SSLStream(tcp, self.ssl_context, server_side=True)
        reason = "timed out"
        with trio.move_on_after(self.handshake_timeout):
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as e:
                # A plaintext client, a client that does not trust our
                # certificate, or (with tls_client_ca) one without a good
                # certificate: an everyday event, not the server's problem.
                reason = _tls_reason(e)
            else:
                return tls
        self.handshake_failures += 1
        log.info("connection %s: TLS handshake failed: %s; closing", peer, reason)
        close_now(tcp)
        return None

    async def _handle(self, tcp: trio.SocketStream) -> None:
        try:
            peer = "{}:{}".format(*tcp.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        self.accepted += 1
        if self.handshaking + len(self.connections) >= self.socket_limit:
            # Every socket is a descriptor, wherever it is in its life: the
            # daemon's own files must never be the ones that do not open.
            await self._refuse(tcp, peer, plaintext=self.ssl_context is None)
            return
        stream: trio.abc.Stream = tcp
        if self.ssl_context is not None:
            # Handshakes cost CPU and are not yet Connections: bound them too.
            if self.handshaking >= self.connection_limit:
                log.info("connection %s: too many TLS handshakes in progress; closing", peer)
                self.handshake_failures += 1
                close_now(tcp)
                return
            self.handshaking += 1
            try:
                tls = await self._handshake(tcp, peer)
            finally:
                self.handshaking -= 1
            if tls is None:
                return
            if self._accepting.cancel_called:
                close_now(tcp)  # the daemon began stopping during the handshake
                return
            stream = tls
        conn = Connection(self, stream, peer, transport=tcp)
        if len(self.connections) >= self.connection_limit:
            e = self._limit_error()
            self._note_refusal(peer, str(e))
            try:
                with trio.move_on_after(1):
                    await conn.messages.send_message(error_response(0, e).SerializeToString())
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError):
                pass
            finally:
                close_now(tcp)
            return
        self.connections.add(conn)
        if self._no_connections.is_set():
            self._no_connections = trio.Event()
        try:
            await conn.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.connections.discard(conn)
            if not self.connections:
                self._no_connections.set()

    def statistics(self) -> dict[str, int]:
        """Counters for tests and status: connections, refusals, handshakes, memory."""
        memory = self.memory.statistics()
        return {
            "connections": len(self.connections),
            "connection_limit": self.connection_limit,
            "accepted": self.accepted,
            "refused": self.refused,
            "stalled_closed": self.stalled_closed,
            "handshaking": self.handshaking,
            "handshake_failures": self.handshake_failures,
            "memory_used": memory["used"],
            "memory_peak": memory["peak"],
            "memory_refusals": memory["refusals"],
        }

    async def wait_connections_closed(self) -> None:
        """Wait until no connection is open."""
        await self._no_connections.wait()
