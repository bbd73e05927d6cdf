"""Configuration values: units, the parsers of each kind of value, and how a key is declared.

Sizes accept a byte count or a string with a unit (``"64 MiB"``, ``"512KiB"``,
``"1GB"``); durations accept seconds or a string with a unit (``"2ms"``,
``"10s"``, ``"5min"``). A parser raises ValueError with a one-line reason;
the loader puts the key's name in front of it. The ``_``-named parsers are
for the sections of this package only.
"""

from __future__ import annotations

import grp
import math
import pathlib
import pwd
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from fractions import Fraction
from typing import Any

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
#: Listen hosts that mean every address of the machine.
_ANY_HOST = frozenset({"0.0.0.0", "::", "*"})


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
#: A metrics endpoint bound to port 0 writes its HOST:PORT to this file in its
#: node's data directory (how a host finds its hosted containers' endpoints).
METRICS_ADDRESS_FILE = "metrics.address"


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
