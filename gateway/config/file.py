"""The whole configuration file: its sections, loading it, and the checks across keys.

Every key has a default, so an empty file is a valid configuration. Unknown
sections, unknown keys and bad values are errors that name the key
(``section.key: reason``); all of them are collected and reported together.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.sections import (
    CacheConfig,
    ClusterConfig,
    ContainerConfig,
    FuseConfig,
    JournalConfig,
    LoggingConfig,
    MetricsConfig,
    NodeConfig,
    ReplicationConfig,
    ServerConfig,
    StreamsConfig,
    Tier2Config,
)
from gateway.config.tls import _tls_context
from gateway.config.values import _ANY_HOST, KiB, parse_host_port
from gateway.errors import ConfigError


@dataclass(frozen=True)
class Config:
    """The whole configuration file."""

    node: NodeConfig = field(default_factory=NodeConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    fuse: FuseConfig = field(default_factory=FuseConfig)
    tier2: Tier2Config = field(default_factory=Tier2Config)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    streams: StreamsConfig = field(default_factory=StreamsConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)

    @property
    def journal_dir(self) -> pathlib.Path:
        """The journal directory, resolved against ``node.data_dir``."""
        return pathlib.Path(self.journal.dir or pathlib.Path(self.node.data_dir) / "journal")

    @property
    def cache_dir(self) -> pathlib.Path:
        """The cache directory, resolved against ``node.data_dir``."""
        return pathlib.Path(self.cache.dir or pathlib.Path(self.node.data_dir) / "cache")

    @classmethod
    def load(cls, path: str | pathlib.Path, *, check_files: bool = True) -> Config:
        """Read and validate a TOML file; raise ConfigError listing every problem.

        ``check_files=False`` skips checking files only the daemon reads (its
        TLS certificate and key), for clients that need only a few keys.
        """
        path = pathlib.Path(path)
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(str(path), ["file: not found"]) from None
        except OSError as e:
            raise ConfigError(str(path), [f"file: cannot read: {e.strerror}"]) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(str(path), [f"file: not valid TOML: {e}"]) from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                str(path), [f"file: not UTF-8 (TOML is): {e.reason} at byte {e.start}"]
            ) from None
        except RecursionError:
            raise ConfigError(str(path), ["file: not valid TOML: nested too deeply"]) from None
        return cls.from_dict(data, source=str(path), check_files=check_files)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], source: str = "<dict>", *, check_files: bool = True
    ) -> Config:
        """Validate an already-parsed TOML document (``check_files`` as in `load`)."""
        errors: list[str] = []
        sections: dict[str, Any] = {}
        known = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name not in known:
                errors.append(f"{name}: unknown section (known: {', '.join(known)})")
            elif not isinstance(value, dict):
                errors.append(f"{name}: must be a table ([{name}])")
            else:
                sections[name] = _parse_section(name, _section_type(known[name]), value, errors)
        if not errors:
            config = cls(**sections)
            errors.extend(_cross_checks(config, check_files))
            if not errors:
                return config
        raise ConfigError(source, errors)


def _section_type(f: dataclasses.Field[Any]) -> Any:
    """The dataclass of a ``Config`` field (its default factory)."""
    return f.default_factory


def _parse_section(name: str, section_type: Any, values: dict[str, Any], errors: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(section_type)}
    kwargs: dict[str, Any] = {}
    for key, raw in values.items():
        f = fields.get(key)
        if f is None:
            errors.append(f"{name}.{key}: unknown key (known: {', '.join(fields)})")
            continue
        try:
            kwargs[key] = f.metadata["parse"](raw)
        except ValueError as e:
            errors.append(f"{name}.{key}: {e}")
    return section_type(**kwargs)


def _cross_checks(c: Config, check_files: bool = True) -> list[str]:
    """Checks that involve more than one key (and, with ``check_files``, the daemon's files)."""
    j = c.journal
    errors = []
    if j.max_frame_bytes > j.max_group_bytes:
        errors.append(
            f"journal.max_frame_bytes: {j.max_frame_bytes} exceeds "
            f"journal.max_group_bytes ({j.max_group_bytes})"
        )
    if j.max_group_bytes > j.max_pending_bytes:
        errors.append(
            f"journal.max_group_bytes: {j.max_group_bytes} exceeds "
            f"journal.max_pending_bytes ({j.max_pending_bytes})"
        )
    if j.max_operation_bytes > j.file_size:
        errors.append(
            f"journal.max_operation_bytes: {j.max_operation_bytes} exceeds "
            f"journal.file_size ({j.file_size})"
        )
    if j.max_operation_bytes > j.max_pending_bytes:
        errors.append(
            f"journal.max_operation_bytes: {j.max_operation_bytes} exceeds "
            f"journal.max_pending_bytes ({j.max_pending_bytes}): it could never be queued"
        )
    overhead = 64 * KiB  # the request's other fields
    if c.server.max_message_bytes < c.container.max_append_bytes + overhead:
        errors.append(
            f"server.max_message_bytes: {c.server.max_message_bytes} is less than "
            f"container.max_append_bytes ({c.container.max_append_bytes}) + 64 KiB"
        )
    if c.container.max_append_bytes + overhead > j.max_operation_bytes:
        errors.append(
            f"container.max_append_bytes: {c.container.max_append_bytes} + 64 KiB exceeds "
            f"journal.max_operation_bytes ({j.max_operation_bytes})"
        )
    t = c.tier2
    if t.flush_size > t.max_chunk_size:
        errors.append(
            f"tier2.flush_size: {t.flush_size} exceeds tier2.max_chunk_size ({t.max_chunk_size})"
        )
    errors.extend(_tls_context(c.server, check_files)[1])
    if c.server.max_memory < max(c.server.max_inflight_bytes, c.server.max_message_bytes):
        errors.append(
            f"server.max_memory: {c.server.max_memory} is less than server.max_inflight_bytes "
            f"({c.server.max_inflight_bytes}) or server.max_message_bytes "
            f"({c.server.max_message_bytes})"
        )
    cl = c.cluster
    if cl.tls_ca and not c.server.tls_cert:
        errors.append("cluster.tls_ca: set without server.tls_cert (nodes speak TLS only "
                      "when they serve it)")  # fmt: skip
    if cl.down_after < 2 * cl.heartbeat_interval:
        errors.append(
            f"cluster.down_after: {cl.down_after:g}s is less than twice "
            f"cluster.heartbeat_interval ({cl.heartbeat_interval:g}s): a live node would "
            "look down between two heartbeats"
        )
    if 0 < cl.lease < 0.2:
        errors.append(f"cluster.lease: {cl.lease:g}s is too short to renew (0 turns it off)")
    r = c.replication
    if r.ack_quorum > r.write_quorum:
        errors.append(
            f"replication.ack_quorum: {r.ack_quorum} is above replication.write_quorum "
            f"({r.write_quorum})"
        )
    if r.write_quorum > 1 and c.tier2.url == "embedded":
        errors.append(
            f"replication.write_quorum: {r.write_quorum} needs other nodes, and an embedded "
            'Tier 2 (tier2.url = "embedded") is this node\'s alone: use a shared bucket'
        )
    if c.metrics.listen and _same_listener(c.server.listen, c.metrics.listen):
        errors.append(f"metrics.listen: same address as server.listen ({c.server.listen})")
    return errors


def _same_listener(a: str, b: str) -> bool:
    """Whether two listen addresses would collide: one port, and one host or a wildcard.

    Port 0 asks the kernel for a free port, so it never collides.
    """
    (host_a, port_a), (host_b, port_b) = parse_host_port(a), parse_host_port(b)
    if port_a == 0 or port_a != port_b:
        return False
    return host_a == host_b or host_a in _ANY_HOST or host_b in _ANY_HOST


def all_keys() -> list[str]:
    """Every ``section.key`` the file may contain (docs and tests use this)."""
    keys: list[str] = []
    for section in dataclasses.fields(Config):
        section_type = _section_type(section)
        keys.extend(f"{section.name}.{f.name}" for f in dataclasses.fields(section_type))
    return keys
