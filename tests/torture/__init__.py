"""Torture tests: random faults against real daemons (one node, and a cluster)."""

from __future__ import annotations

from collections.abc import Callable


def check_lines(
    data: bytes, expected: Callable[[int], bytes], at_least: int, where: str, what: str
) -> int:
    """``data`` is lines ``expected(0), expected(1), ...``: whole, in order, none twice.

    At least ``at_least`` of them (the acknowledged ones); returns how many.
    ``what`` names the segment in the failure message.
    """
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        raise AssertionError(f"{where}: {what} ends inside a line")
    for i, got in enumerate(lines):
        if got != expected(i):
            raise AssertionError(f"{where}: line {i} of {what} is {got!r}")
    if len(lines) < at_least:
        raise AssertionError(f"{where}: {len(lines)} lines, {at_least} were acknowledged")
    return len(lines)
