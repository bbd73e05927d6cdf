"""The sections of the configuration file, one frozen dataclass each, every key declared with
its default, its parser and one line of docs (docs/CONFIG.md lists them)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from gateway.config.tls import _tls_context
from gateway.config.values import (
    GiB,
    KiB,
    MiB,
    _abs_path_or_empty,
    _advertise,
    _bool,
    _choice,
    _duration_in,
    _group,
    _http_url_or_empty,
    _int_in,
    _key,
    _listen,
    _listen_or_empty,
    _node_id,
    _path,
    _shown,
    _size_in,
    _string,
    _tier2_url,
    _user,
    duration_text,
    parse_duration,
    parse_size,
    size_text,
)
from gateway.errors import ConfigError


@dataclass(frozen=True)
class NodeConfig:
    """``[node]``: who this node is and where its local state lives."""

    id: str = _key("node-1", _node_id, "names this node's prefix in Tier 2")
    data_dir: str = _key(
        "/var/lib/segment-gateway", _path, "journal/, cache/ and embedded S3 data live here"
    )
    advertise: str = _key(
        "", _advertise, 'HOST:PORT other nodes and clients use; "" = the address listened on'
    )


@dataclass(frozen=True)
class ServerConfig:
    """``[server]``: the wire-protocol listener."""

    listen: str = _key("127.0.0.1:9410", _listen, "HOST:PORT for the protocol")
    token: str = _key("", _string, 'clients must present it in Hello; "" = no token')
    max_message_bytes: int = _key(
        9 * MiB, _size_in(64 * KiB, 1 * GiB), "largest protocol message read"
    )
    max_inflight_bytes: int = _key(
        32 * MiB, _size_in(64 * KiB, 16 * GiB), "per connection: unanswered request bytes"
    )
    max_connections: int = _key(1024, _int_in(1, 1_000_000), "concurrent client connections")
    max_memory: int = _key(
        256 * MiB,
        _size_in(1 * MiB, 1024 * GiB),
        "all connections together: request and answer bytes held in memory",
    )
    memory_timeout: float = _key(
        5.0,
        _duration_in(0.0, 3600),
        "how long a large message waits for room in max_memory before OVERLOADED",
    )
    message_timeout: float = _key(
        30.0, _duration_in(0.1, 3600), "once a message's length has arrived, time for the rest"
    )
    send_timeout: float = _key(
        60.0, _duration_in(0.1, 86400), "time one answer (or read piece) may take to be taken"
    )
    drain_timeout: float = _key(
        10.0, _duration_in(0.0, 3600), "at stop: time for requests in flight to be answered"
    )
    # The files are checked (readable, valid, matching) by the cross-checks,
    # which clients reading this file only for listen/token skip: they need
    # not be able to read the daemon's private key.
    tls_cert: str = _key("", _abs_path_or_empty, 'PEM certificate (chain) for TLS; "" = plain TCP')
    tls_key: str = _key("", _abs_path_or_empty, "PEM private key of tls_cert (unencrypted)")
    tls_client_ca: str = _key(
        "", _abs_path_or_empty, 'PEM CA(s) a client certificate must chain to; "" = none'
    )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None without ``tls_cert``); ConfigError names the key."""
        context, errors = _tls_context(self)
        if errors:
            raise ConfigError("[server]", errors)
        return context


@dataclass(frozen=True)
class ContainerConfig:
    """``[container]``: the segment container's limits."""

    max_append_bytes: int = _key(8 * MiB, _size_in(1, 512 * MiB), "largest single append")
    max_segments: int = _key(1_000_000, _int_in(1), "segments that may exist at once")
    max_attributes: int = _key(
        16384, _int_in(2, 10_000_000), "attribute values a segment keeps in memory"
    )
    overload_timeout: float = _key(
        5.0, _duration_in(0.0, 3600.0), "how long an append waits for the journal before Overloaded"
    )
    checkpoint_min_segments: int = _key(
        1024, _int_in(1), "unchanged segments each rolling checkpoint rewrites at least"
    )


def _budget(value: Any) -> int:
    if value == "auto" or (value == 0 and not isinstance(value, bool)):
        return 0  # 0 is how "auto" is kept once parsed
    n = parse_size(value)
    if n < 4 * MiB:
        raise ValueError(f'must be "auto" or at least 4 MiB, got {n}')
    return n


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.05 <= value <= 0.95:
        raise ValueError(f"must be a number between 0.05 and 0.95, got {_shown(value)}")
    return float(value)


@dataclass(frozen=True)
class CacheConfig:
    """``[cache]``: the RocksDB cache (unflushed append data and Tier-2 blocks)."""

    dir: str = _key("", _abs_path_or_empty, 'cache directory; "" = <node.data_dir>/cache')
    budget: int = _key(0, _budget, '"auto" (0: 4 GiB or 25% of free disk, the smaller) or a size')
    pinned_share: float = _key(
        0.5, _fraction, "share of the budget unflushed data may take before appends wait"
    )


@dataclass(frozen=True)
class FuseConfig:
    """``[fuse]``: the read-only mount."""

    mountpoint: str = _key("/srv/segments", _abs_path_or_empty, '"" disables the mount')
    allow_other: bool = _key(
        False, _bool, "let users other than the daemon's read the mount (FUSE allow_other)"
    )
    owner: str = _key("", _user, 'owner of every file and directory (name or uid; "" = daemon)')
    group: str = _key("", _group, 'group of every file and directory (name or gid; "" = daemon)')
    active_timeout: float = _key(
        0.5, _duration_in(0.0, 1.0), "kernel attribute/entry cache time for active segments"
    )
    sealed_timeout: float = _key(
        3600.0, _duration_in(0.0, 86400 * 365), "kernel cache time for sealed segments"
    )
    read_ahead_kb: int = _key(
        4096, _int_in(0, 1024 * 1024), "kernel read-ahead of the mount (0 = leave the default)"
    )
    prefetch_memory: int = _key(
        256 * MiB,
        _size_in(16 * MiB, 64 * GiB),
        "memory for Tier-2 blocks fetched ahead of readers (all handles together)",
    )
    passthrough: bool = _key(
        True, _bool, "serve sealed segments through FUSE passthrough from local segment files"
    )
    passthrough_budget: int = _key(
        0, _budget, '"auto" (0: 4 GiB or 25% of free disk, the smaller) or a size: segment files'
    )


@dataclass(frozen=True)
class Tier2Config:
    """``[tier2]``: where chunks go."""

    url: str = _key("embedded", _tier2_url, "embedded, s3://bucket/prefix or file:///path")
    endpoint_url: str = _key("", _http_url_or_empty, "S3-compatible endpoint; empty = AWS")
    region: str = _key("us-east-1", _string, "S3 region used to sign requests")
    flush_size: int = _key(
        8 * MiB, _size_in(4 * KiB, 5 * GiB), "flush a segment once this much is unflushed"
    )
    flush_interval: float = _key(
        10.0, _duration_in(0.01, 86400), "flush once the oldest unflushed byte is this old"
    )
    max_chunk_size: int = _key(
        64 * MiB, _size_in(64 * KiB, 5 * GiB), "roll to a new chunk once one reaches this size"
    )
    max_concurrency: int = _key(8, _int_in(1, 256), "Tier-2 requests in flight at once")
    flush_concurrency: int = _key(4, _int_in(1, 64), "segments flushed at once")
    request_timeout: float = _key(
        30.0, _duration_in(0.1, 3600), "connect/read timeout of one Tier-2 request"
    )
    retry_deadline: float = _key(
        60.0, _duration_in(0.1, 86400), "give up retrying one Tier-2 call after this long"
    )
    read_ahead: int = _key(
        32, _int_in(0, 1024), "MiB fetched ahead of a sequential reader (8 MiB GETs)"
    )
    snapshot_interval: float = _key(
        60.0, _duration_in(0.0, 86400), "at most one metadata snapshot upload per this interval"
    )
    snapshots_kept: int = _key(
        5, _int_in(1, 10_000), "whole metadata snapshots kept in Tier 2 (each with two deltas)"
    )
    gc_interval: float = _key(600.0, _duration_in(0.1, 86400 * 7), "time between GC passes")
    gc_grace: float = _key(
        3600.0, _duration_in(0.0, 86400 * 30), "unreferenced objects younger than this are kept"
    )
    stop_flush_timeout: float = _key(
        30.0, _duration_in(0.0, 86400), "at stop: time to flush unflushed data to Tier 2 (0: none)"
    )
    defrag: bool = _key(True, _bool, "merge runs of small adjacent chunks (bindings with concat)")
    defrag_min_chunks: int = _key(
        16, _int_in(2, 100_000), "merge a run of at least this many adjacent small chunks"
    )
    defrag_small: int = _key(
        0, _size_in(0, 5 * GiB), "a chunk below this is small; 0 = max_chunk_size / 4"
    )
    defrag_rate: int = _key(
        16 * MiB, _size_in(4 * KiB, 100 * GiB), "at most this many bytes merged per second"
    )
    defrag_interval: float = _key(
        60.0, _duration_in(0.01, 86400), "time between the optimizer's looks at flushed segments"
    )
    defrag_concurrency: int = _key(4, _int_in(1, 64), "segments merged at once")
    embedded_port: int = _key(
        0, _int_in(0, 55535), "embedded S3 port (0 = a free one; gRPC ports are +10000)"
    )


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: the Prometheus endpoint."""

    listen: str = _key("127.0.0.1:9411", _listen_or_empty, 'HOST:PORT for /metrics; "" = none')


@dataclass(frozen=True)
class LoggingConfig:
    """``[logging]``."""

    level: str = _key("info", _choice("debug", "info", "warning", "error"), "log level")


@dataclass(frozen=True)
class JournalConfig:
    """``[journal]``: the Tier-1 write-ahead journal (docs/FORMATS.md)."""

    dir: str = _key("", _abs_path_or_empty, 'journal directory; "" = <node.data_dir>/journal')
    file_size: int = _key(256 * MiB, _size_in(1 * MiB, 64 * GiB), "roll to a new file past this")
    preallocate_step: int = _key(
        64 * MiB, _size_in(64 * KiB, 64 * GiB), "files grow in steps of this (posix_fallocate)"
    )
    max_frame_bytes: int = _key(1 * MiB, _size_in(4 * KiB, 256 * MiB), "largest frame payload")
    max_group_bytes: int = _key(
        8 * MiB, _size_in(4 * KiB, 1 * GiB), "largest write group (frames per fdatasync)"
    )
    group_commit_wait: float = _key(
        0.0, _duration_in(0.0, 1.0), "extra time a group may wait for more operations"
    )
    max_pending_bytes: int = _key(
        64 * MiB, _size_in(64 * KiB, 16 * GiB), "queued unsynced bytes before appends wait"
    )
    max_operation_bytes: int = _key(
        16 * MiB, _size_in(1 * KiB, 1 * GiB), "one operation larger than this is refused"
    )
    checkpoint_every_frames: int = _key(300, _int_in(1), "frames between checkpoints")
    checkpoint_every_bytes: int = _key(
        256 * MiB, _size_in(1 * MiB, 1024 * GiB), "bytes between checkpoints"
    )
    reserve: int = _key(
        0,
        _size_in(0, 64 * GiB),
        'disk kept for flush records and checkpoints when full; 0 = "auto"',
    )


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the nodes sharing one Tier-2 bucket and prefix."""

    heartbeat_interval: float = _key(
        2.0, _duration_in(0.1, 3600), "how often this node refreshes its registry record"
    )
    down_after: float = _key(
        15.0, _duration_in(0.5, 86400), "a node whose heartbeat is older than this is down"
    )
    refresh_interval: float = _key(
        0.5, _duration_in(0.05, 60), "how often other nodes' segments and lengths are polled"
    )
    lease: float = _key(
        10.0,
        _duration_in(0.0, 3600),
        "acknowledge changes only this long after last confirming in Tier 2 that no other "
        "process took this node id over; a takeover waits it out (0 = no lease)",
    )
    tls_ca: str = _key(
        "",
        _abs_path_or_empty,
        'CA (PEM) other nodes\' certificates are checked against; "" = server.tls_client_ca',
    )
    takeover: bool = _key(
        True,
        _bool,
        "run a node's container here when it has been down for down_after (with "
        "replication.write_quorum > 1; one surviving node wins the claim)",
    )
    handback: bool = _key(
        True,
        _bool,
        "give a taken-over container back when its own node returns (false: it stays "
        "where it runs and the returning node refuses to start)",
    )


@dataclass(frozen=True)
class ReplicationConfig:
    """``[replication]``: the journal's copies on other nodes (BookKeeper's quorums)."""

    write_quorum: int = _key(
        1,
        _int_in(1, 15),
        "nodes that hold each journal write group, this node's own disk included "
        "(1 = no replication)",
    )
    ack_quorum: int = _key(
        0,
        _int_in(0, 15),
        "copies synced before an append is acknowledged, this node's own included "
        "(0 = a majority of write_quorum)",
    )
    ack_timeout: float = _key(
        30.0,
        _duration_in(0.1, 86400),
        "a change not on ack_quorum copies within this is answered NoQuorum "
        "(it may still become durable)",
    )
    peer_timeout: float = _key(
        3.0,
        _duration_in(0.1, 3600),
        "a replica that leaves a write unanswered this long is out of the ensemble "
        "until it catches up",
    )
    lag_bytes: int = _key(
        64 * MiB,
        _size_in(1 * MiB, 64 * GiB),
        "a replica further behind than this catches up from the journal files, not memory",
    )

    @property
    def acks(self) -> int:
        """The ack quorum in force: ``ack_quorum``, or a majority of ``write_quorum``."""
        return self.ack_quorum or self.write_quorum // 2 + 1


#: The largest value of each stream policy (``StreamPolicy`` field -> bound),
#: whether a ``[streams]`` default, a ``stream create|set`` option or a request.
STREAM_POLICY_MAX = {
    "roll_size": 1 << 50,
    "roll_age_ms": 10 * 365 * 86400 * 1000,
    "retain_size": 1 << 60,
    "retain_age_ms": 100 * 365 * 86400 * 1000,
}


def stream_policy_text(field: str, value: int) -> str:
    """A stream policy's value (bytes, or milliseconds for ``*_ms``) for messages."""
    return duration_text(value / 1000) if field.endswith("_ms") else size_text(value)


def parse_stream_policy(field: str, value: Any) -> int:
    """A stream policy (a `STREAM_POLICY_MAX` field) from a size, or a duration for
    ``*_ms``, in the field's unit (bytes, milliseconds); ValueError when out of range."""
    n = round(parse_duration(value) * 1000) if field.endswith("_ms") else parse_size(value)
    most = STREAM_POLICY_MAX[field]
    if n > most:
        raise ValueError(f"must be at most {stream_policy_text(field, most)}, got {_shown(value)}")
    return n


@dataclass(frozen=True)
class StreamsConfig:
    """``[streams]``: stream policy defaults (rolling, retention) and transactions."""

    roll_size: int = _key(
        1 * GiB,
        _size_in(0, STREAM_POLICY_MAX["roll_size"]),
        "seal a stream's current segment at this size (0 = never)",
    )
    roll_age: float = _key(
        3600.0,
        _duration_in(0.0, STREAM_POLICY_MAX["roll_age_ms"] / 1000),
        "seal a stream's current segment when its first byte is this old (0 = never)",
    )
    retain_size: int = _key(
        0,
        _size_in(0, STREAM_POLICY_MAX["retain_size"]),
        "delete a stream's oldest data while the newer bytes alone are at least this many "
        "(0 = keep all)",
    )
    retain_age: float = _key(
        0.0,
        _duration_in(0.0, STREAM_POLICY_MAX["retain_age_ms"] / 1000),
        "delete a stream's sealed segments last changed longer ago than this (0 = keep all)",
    )
    retain_unflushed: bool = _key(
        False, _bool, "whether retention may delete bytes that are not yet in Tier 2"
    )
    interval: float = _key(
        10.0,
        _duration_in(0.01, 86400.0),
        "how often rolling by age, retention and transaction timeouts are applied",
    )
    txn_timeout: float = _key(
        60.0, _duration_in(0.01, 7 * 86400.0), "a transaction not committed in this long is aborted"
    )
    max_txn_timeout: float = _key(
        86400.0, _duration_in(0.01, 30 * 86400.0), "the longest timeout a client may ask for"
    )
    txn_outcomes: int = _key(
        10_000,
        _int_in(0, 1_000_000),
        "finished transactions whose outcome a commit sent again is answered from",
    )
    txn_outcome_age: float = _key(
        3600.0,
        _duration_in(0.0, 30 * 86400.0),
        "how long the outcome of a finished transaction is remembered",
    )
