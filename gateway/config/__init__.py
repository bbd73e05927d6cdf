"""The daemon's configuration: one TOML file parsed into typed dataclasses.

Every key has a default, so an empty file is a valid configuration. Unknown
sections, unknown keys and bad values are errors that name the key
(``section.key: reason``); all of them are collected and reported together.
Sizes accept a byte count or a string with a unit (``"64 MiB"``, ``"512KiB"``,
``"1GB"``); durations accept seconds or a string with a unit (``"2ms"``,
``"10s"``, ``"5min"``). docs/CONFIG.md lists every key.

One module per job: `values` (units, value parsers, how a key is declared),
`sections` (one dataclass per ``[section]``), `tls` (the server's TLS
context from its files), `file` (`Config`: loading, checks across keys).
Everything public is importable from here.
"""

from gateway.config.file import Config, all_keys
from gateway.config.sections import (
    STREAM_POLICY_MAX,
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
    parse_stream_policy,
    stream_policy_text,
)
from gateway.config.values import (
    CLUSTER_PREFIX,
    DEFAULT_CONFIG_PATH,
    MAX_ID,
    METRICS_ADDRESS_FILE,
    GiB,
    KiB,
    MiB,
    Parser,
    duration_text,
    parse_duration,
    parse_host_port,
    parse_size,
    size_text,
)

__all__ = [
    "CLUSTER_PREFIX",
    "DEFAULT_CONFIG_PATH",
    "MAX_ID",
    "METRICS_ADDRESS_FILE",
    "STREAM_POLICY_MAX",
    "CacheConfig",
    "ClusterConfig",
    "Config",
    "ContainerConfig",
    "FuseConfig",
    "GiB",
    "JournalConfig",
    "KiB",
    "LoggingConfig",
    "MetricsConfig",
    "MiB",
    "NodeConfig",
    "Parser",
    "ReplicationConfig",
    "ServerConfig",
    "StreamsConfig",
    "Tier2Config",
    "all_keys",
    "duration_text",
    "parse_duration",
    "parse_host_port",
    "parse_size",
    "parse_stream_policy",
    "size_text",
    "stream_policy_text",
]
