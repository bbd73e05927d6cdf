"""The exact value parsers of the command line: every value is checked before anything is done.

Each is an argparse ``type``: a bad value ends the command with one line
naming the option and exit 2 (bad usage), never a traceback. The limits
are the daemon's (`MAX_OFFSET`, `MAX_TIMEOUT`), and sizes and durations are
parsed as the configuration parses them (`gateway.config`), so a value
accepted here is one the daemon takes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

#: Offsets (bytes) a segment can have: the journal keeps them as int64.
MAX_OFFSET = 2**63 - 1
#: The longest --timeout of a client command (30 days, as the daemon allows for a flush).
MAX_TIMEOUT = 30 * 86400.0
#: Arguments sent to the daemon as protobuf strings: they must be UTF-8.
_WIRE_TEXT = ("segment", "name", "prefix", "token", "tls_server_name")


def _value_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse type from a parser raising ValueError (its message says why)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name  # argparse names it in some messages
    return convert


def seconds(lo: float, hi: float, zero: bool = False) -> Callable[[str], float]:
    """Seconds as a number or a duration ("90", "1.5", "2min"), in (lo, hi] (0 too if ``zero``)."""
    from gateway.config import duration_text, parse_duration

    def parse(text: str) -> float:
        value = parse_duration(text)
        if (value == 0 and zero) or lo < value <= hi:
            return value
        bound = f"more than {duration_text(lo)}" if lo else "more than 0"
        raise ValueError(
            f"must be {bound}{' (or 0)' if zero else ''} and at most {duration_text(hi)}, "
            f"got {text!r}"[:200]
        )

    return _value_type(parse, "seconds")


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number in [lo, hi] (ASCII digits, an optional minus)."""
    import re

    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*-?[0-9]{1,30}\s*", text):
            raise ValueError(f"expected a whole number, got {text!r}"[:200])
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {value}")
        return value

    return _value_type(parse, "integer")


def host_port(text: str) -> str:
    """HOST:PORT (argparse type of --connect)."""
    from gateway.config import parse_host_port

    try:
        parse_host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)[:200]) from None
    return text


def writer_uuid(text: str) -> str:
    """A writer id: a UUID (argparse type of --writer-id)."""
    import uuid

    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a UUID (e.g. {uuid.UUID(int=0)}), got {text!r}"[:200]
        ) from None


def policy_option(field: str) -> Callable[[str], int | str]:
    """A stream policy option: a size or duration within the policy's bounds, or "default"."""
    from gateway.config import parse_stream_policy

    def parse(text: str) -> int | str:
        return text if text == "default" else parse_stream_policy(field, text)

    return _value_type(parse, "policy")


def check_wire_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (one line, exit 2) an argument the wire cannot carry: bytes that are not
    UTF-8 reach Python as lone surrogates."""
    for dest in _WIRE_TEXT:
        value = getattr(args, dest, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                shown = value.encode("utf-8", "surrogateescape")
                parser.error(f"argument {dest.upper()}: {shown!r} is not UTF-8"[:300])


def attribute_id(text: str) -> bytes:
    """An attribute id given as 32 hex digits (argparse type)."""
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not hex") from None
    if len(value) != 16:
        raise argparse.ArgumentTypeError(f"{text!r} is not 16 bytes (32 hex digits)")
    return value
