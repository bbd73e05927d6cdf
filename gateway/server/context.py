"""What the request handlers see of a connection and of the server, as protocols.

The connection (`connection.py`) runs the handlers and the listener
(`listener.py`) runs the connections; the handlers, the handshake and the
routing know both only as these, so the package's imports run one way:
listener over connection over handlers over routing, registry and answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims
    from gateway.cluster.failover import ContainerHost
    from gateway.cluster.view import ClusterView
    from gateway.config import ServerConfig
    from gateway.container.container import SegmentContainer
    from gateway.fsck.checks import Target
    from gateway.fsck.report import FsckRecord
    from gateway.protocol import wire_pb2 as wire
    from gateway.protocol.framing import MessageStream
    from gateway.replication.replicator import Replicator
    from gateway.replication.store import ReplicaStore

    from .budget import MemoryBudget


class ServerParts(Protocol):
    """The server's parts a request may use (`listener.Server` has them)."""

    #: This node's segments.
    container: SegmentContainer
    #: Other nodes and their segments (None: this node alone).
    cluster: ClusterView | None
    #: Cluster-wide name claims (None: names are this node's alone).
    claims: NameClaims | None
    config: ServerConfig
    #: ``node.id``.
    node: str
    #: The live state fsck checks; None: the container alone.
    fsck_target: Callable[[], Target] | None
    #: What the online fsck runs found (the ``fsck_*`` metrics).
    fsck_record: FsckRecord
    #: Seconds a client has to complete the TLS handshake, and then to send Hello.
    handshake_timeout: float
    #: ``container.max_append_bytes``, told to clients in Hello.
    container_config_max_append: int
    #: Bytes held by requests in flight, across connections.
    memory: MemoryBudget
    #: Other nodes' journals held here (None: this node keeps no replicas).
    replicas: ReplicaStore | None
    #: Whether a source node's epoch is still its current one in Tier 2
    #: (checked before a replica log starts; None: not checked).
    epoch_current: Callable[[str, int], Awaitable[bool]] | None
    #: This node's journal's replication (None: not replicated).
    replicator: Replicator | None
    #: Other nodes' containers run on this host (None: this node takes none over).
    containers: ContainerHost | None
    #: Requests taken since the start, by kind (Hello left out).
    requests: dict[str, int]
    #: The node at a glance (`gateway.status`); None: not wired (a bare server).
    summarize: Callable[[], Awaitable[wire.NodeSummary]] | None


class Peer(Protocol):
    """One client's connection, as a handler sees it (`connection.Connection`)."""

    server: ServerParts
    #: The client's address, for log lines.
    peer: str
    #: Whether the client has said Hello (with the token, if one is required).
    greeted: bool
    #: What the client called itself in Hello.
    client_name: str
    messages: MessageStream
