"""The daemon's configuration: one TOML file parsed into typed dataclasses.

Every key has a default, so an empty file is a valid configuration. Unknown
sections, unknown keys and bad values are errors that name the key
(``section.key: reason``); all of them are collected and reported together.
Sizes accept a byte count or a string with a unit (``"64 MiB"``, ``"512KiB"``,
``"1GB"``); durations accept seconds or a string with a unit (``"2ms"``,
``"10s"``, ``"5min"``). docs/CONFIG.md lists every key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import math
import pathlib
import pwd
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gateway.errors import ConfigError, os_reason

DEFAULT_CONFIG_PATH = pathlib.Path("/etc/segment-gateway/gateway.toml")

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024 * GiB,
    "p": 1000**5,
    "pb": 1000**5,
    "pib": 1024**5,
}
_DURATION_UNITS = {
    "": 1, "s": 1, "ms": Fraction(1, 1000), "us": Fraction(1, 10**6), "min": 60, "h": 3600,
    "d": 86400,
}  # fmt: skip
_NUMBER_WITH_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

Parser = Callable[[Any], Any]
#: Numbers beyond this (40 digits) are out of every range here, and a float holds them.
_LARGEST_NUMBER = 10**40


def _shown(value: Any, most: int = 40) -> str:
    """``repr(value)``, cut short: an error message stays one readable line."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 5]}...{text[-2:]} ({len(text)} chars)"


def _number_with_unit(value: str, units: Mapping[str, Any]) -> Fraction | None:
    """The number a string such as ``"1.5 KiB"`` means, exactly; None if it is not one."""
    m = _NUMBER_WITH_UNIT.match(value)
    if not m or m.group(2).lower() not in units:
        return None
    if len(m.group(1)) > 40:
        raise ValueError(f"{_shown(value)} is out of range (a number of over 40 digits)")
    # A unit multiplies it by 1024**5 at most: still far from a float's limit.
    # Exact: a float overflows (to inf) on a long digit string, and rounds.
    return Fraction(m.group(1)) * Fraction(units[m.group(2).lower()])


def parse_size(value: Any) -> int:
    """A byte count from an integer or a string such as ``"64 MiB"``.

    Raises ValueError (one line) for anything else; the caller checks the range.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size (bytes, or a string such as '64 MiB'), got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {_shown(value)}")
        return value
    if isinstance(value, str):
        n = _number_with_unit(value, _SIZE_UNITS)
        if n is not None:
            return int(n)
        raise ValueError(
            f"cannot read {_shown(value)} as a size (examples: 4096, '512 KiB', '64MiB')"
        )
    raise ValueError(f"expected a size, got {type(value).__name__}")


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``"2ms"`` or ``"10s"``.

    Raises ValueError (one line) for anything else, NaN and infinities; the
    caller checks the range.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration (seconds, or a string such as '2ms'), got a boolean")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"expected a finite duration, got {value}")
        if value > _LARGEST_NUMBER:
            raise ValueError(f"duration {_shown(value)} is out of range")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {_shown(value)}")
        seconds: float | Fraction = value
    elif isinstance(value, str):
        n = _number_with_unit(value, _DURATION_UNITS)
        if n is None:
            raise ValueError(
                f"cannot read {_shown(value)} as a duration (examples: 0.5, '2ms', '10s')"
            )
        seconds = n
    else:
        raise ValueError(f"expected a duration, got {type(value).__name__}")
    return float(seconds)  # finite: at most _LARGEST_NUMBER


def parse_host_port(value: str) -> tuple[str, int]:
    """Split ``"host:port"`` or ``"[v6addr]:port"``; raise ValueError if malformed."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})|([^:\[\]\s]+):([0-9]{1,5})", value)
    if not m:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9410), got {_shown(value)}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return host, port


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {type(value).__name__}")
    return value


def _user(value: Any) -> str:
    """A user name or numeric uid that exists here ("" = the daemon's)."""
    text = _string(value)
    if text and not _numeric_id(text):
        try:
            pwd.getpwnam(text)
        except KeyError:
            raise ValueError(f"no user named {_shown(text)} on this machine") from None
    return text


def _group(value: Any) -> str:
    """A group name or numeric gid that exists here ("" = the daemon's)."""
    text = _string(value)
    if text and not _numeric_id(text):
        try:
            grp.getgrnam(text)
        except KeyError:
            raise ValueError(f"no group named {_shown(text)} on this machine") from None
    return text


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    if "\0" in value:
        # No path, name or address holds one; the OS would refuse it later.
        raise ValueError(f"must not contain a NUL character, got {_shown(value)}")
    return value


#: Largest user or group id (the kernel's uid_t, less the "no id" value -1).
MAX_ID = 2**32 - 2


def _numeric_id(text: str) -> bool:
    """Whether a ``fuse.owner``/``fuse.group`` value is a numeric id (ASCII digits only)."""
    if not re.fullmatch(r"[0-9]+", text):
        return False
    if len(text) > 10 or int(text) > MAX_ID:
        raise ValueError(f"id {_shown(text)} is out of range 0..{MAX_ID}")
    return True


def _int_in(lo: int, hi: int | None = None) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {type(value).__name__}")
        if value < lo or (hi is not None and value > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise ValueError(f"must be {bound}, got {_shown(value)}")
        return value

    return parse


def size_text(n: int) -> str:
    """A byte count for messages: ``"1 GiB"`` when a power-of-1024 unit divides it."""
    for unit, name in (
        (1024**5, "PiB"),
        (1024**4, "TiB"),
        (GiB, "GiB"),
        (MiB, "MiB"),
        (KiB, "KiB"),
    ):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} bytes"


def duration_text(seconds: float) -> str:
    """A duration for messages: ``"10d"``, ``"2h"``, ``"0.5s"``."""
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= unit and seconds % unit == 0:
            return f"{seconds / unit:g}{name}"
    return f"{seconds:g}s"


def _size_in(lo: int, hi: int) -> Parser:
    def parse(value: Any) -> int:
        n = parse_size(value)
        if not lo <= n <= hi:
            raise ValueError(
                f"must be between {size_text(lo)} and {size_text(hi)}, got {_shown(value)}"
            )
        return n

    return parse


def _duration_in(lo: float, hi: float) -> Parser:
    def parse(value: Any) -> float:
        s = parse_duration(value)
        if not lo <= s <= hi:
            raise ValueError(
                f"must be between {duration_text(lo)} and {duration_text(hi)}, got {_shown(value)}"
            )
        return s

    return parse


def _listen(value: Any) -> str:
    s = _string(value)
    parse_host_port(s)
    return s


def _listen_or_empty(value: Any) -> str:
    s = _string(value)
    if s:
        parse_host_port(s)
    return s


def _choice(*choices: str) -> Parser:
    def parse(value: Any) -> str:
        s = _string(value)
        if s not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {_shown(s)}")
        return s

    return parse


#: Tier-2 prefix of the cluster's shared records (registry, names, fences): no node may use it.
CLUSTER_PREFIX = "_cluster"


def _node_id(value: Any) -> str:
    s = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", s) or s in (".", "..", CLUSTER_PREFIX):
        raise ValueError(
            f"must be 1-64 characters of A-Z a-z 0-9 . _ - (not ., .. or {CLUSTER_PREFIX}); "
            f"got {_shown(s)}"
        )
    return s


def _advertise(value: Any) -> str:
    s = _string(value)
    if not s:
        return s
    host, port = parse_host_port(s)
    if port == 0:
        raise ValueError(f"must name the port other nodes connect to, not 0; got {_shown(s)}")
    if host in _ANY_HOST:
        raise ValueError(
            f"must be an address other nodes can reach, not a wildcard; got {_shown(s)}"
        )
    return s


def _abs_path_or_empty(value: Any) -> str:
    s = _string(value)
    if s and not s.startswith("/"):
        # Relative paths would depend on the daemon's working directory, which
        # systemd sets to /; say so instead of guessing.
        raise ValueError(f"must be an absolute path (or empty), got {_shown(s)}")
    return s


def _path(value: Any) -> str:
    s = _string(value)
    if not s:
        raise ValueError("must not be empty")
    return s


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _tier2_url(value: Any) -> str:
    s = _string(value)
    if s == "embedded":
        return s
    if s.startswith("s3://"):
        bucket = s[5:].split("/", 1)[0]
        if not _BUCKET.fullmatch(bucket):
            raise ValueError(
                f"bucket {_shown(bucket)} is not a valid S3 bucket name "
                "(3-63 characters of a-z 0-9 . -)"
            )
        return s
    if s.startswith("file:///"):
        return s
    raise ValueError(
        f"must be 'embedded', 's3://BUCKET[/PREFIX]' or 'file:///PATH'; got {_shown(s)}"
    )


def _http_url_or_empty(value: Any) -> str:
    s = _string(value)
    if s and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", s):
        raise ValueError(f"must be an http(s):// URL or empty, got {_shown(s)}")
    return s


def _key(default: Any, parser: Parser, doc: str) -> Any:
    """Declare a config key: its default, how to parse it, and one line of docs."""
    return field(default=default, metadata={"parse": parser, "doc": doc})


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


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted
    # key, which hangs a daemon; refuse instead.
    raise ValueError("the key is encrypted; give an unencrypted key readable only by the daemon")


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


def _server_ssl_context(c: ServerConfig) -> ssl.SSLContext | None:
    """Build the context; raises ValueError naming the key at fault."""
    if not c.tls_cert:
        return None
    # PROTOCOL_TLS_SERVER rather than create_default_context(CLIENT_AUTH): the
    # latter also trusts the system CAs for client certificates, so with
    # tls_client_ca any publicly issued certificate would be let in.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(c, key)
        try:
            # Opening is the only honest test: permissions, ACLs, a directory,
            # a dangling link all show up here rather than at the first client.
            with open(path, "rb") if path else contextlib.nullcontext():
                pass
        except OSError as e:
            raise ValueError(f"server.{key}: cannot read {path}: {e.strerror or e}") from None
    # OpenSSL's errors do not say which file is wrong; a look at the PEM
    # labels does, for the common mistakes (swapped files, DER, a CSR).
    if not _pem_has(c.tls_cert, "CERTIFICATE"):
        raise ValueError(f"server.tls_cert: {c.tls_cert} holds no PEM certificate")
    if not _pem_has(c.tls_key, "PRIVATE KEY"):
        raise ValueError(f"server.tls_key: {c.tls_key} holds no PEM private key")
    try:
        ctx.load_cert_chain(c.tls_cert, c.tls_key, password=_no_password)
    except ValueError as e:
        raise ValueError(f"server.tls_key: {e}") from None
    except (ssl.SSLError, OSError) as e:
        raise ValueError(
            f"server.tls_key: cannot use {c.tls_key} with the certificate in {c.tls_cert} "
            f"(not its private key?): {os_reason(e)}"
        ) from None
    if c.tls_client_ca:
        try:
            ctx.load_verify_locations(cafile=c.tls_client_ca)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(
                f"server.tls_client_ca: cannot load {c.tls_client_ca} "
                f"(PEM CA certificates expected): {os_reason(e)}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _pem_has(path: str, label: str) -> bool:
    """Whether the file has a PEM block whose label ends with ``label``."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    return re.search(rb"-----BEGIN [A-Z0-9 ]*" + label.encode() + rb"-----", text) is not None


def _tls_context(
    c: ServerConfig, check_files: bool = True
) -> tuple[ssl.SSLContext | None, list[str]]:
    """The server's TLS context, or the errors (naming the keys) that prevent it.

    Without ``check_files`` only the keys' combination is checked (and no
    context is built).
    """
    if bool(c.tls_cert) != bool(c.tls_key):
        given, missing = ("tls_cert", "tls_key") if c.tls_cert else ("tls_key", "tls_cert")
        return None, [f"server.{missing}: required when server.{given} is set (TLS needs both)"]
    if c.tls_client_ca and not c.tls_cert:
        return None, ["server.tls_client_ca: requires server.tls_cert and server.tls_key (TLS)"]
    if not check_files:
        return None, []
    try:
        return _server_ssl_context(c), []
    except ValueError as e:
        return None, [str(e)]


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
    snapshots_kept: int = _key(5, _int_in(1, 10_000), "metadata snapshots kept in Tier 2")
    gc_interval: float = _key(600.0, _duration_in(0.1, 86400 * 7), "time between GC passes")
    gc_grace: float = _key(
        3600.0, _duration_in(0.0, 86400 * 30), "unreferenced objects younger than this are kept"
    )
    stop_flush_timeout: float = _key(
        30.0, _duration_in(0.0, 86400), "at stop: time to flush unflushed data to Tier 2 (0: none)"
    )
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
    if c.metrics.listen and _same_listener(c.server.listen, c.metrics.listen):
        errors.append(f"metrics.listen: same address as server.listen ({c.server.listen})")
    return errors


_ANY_HOST = frozenset({"0.0.0.0", "::", "*"})


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
