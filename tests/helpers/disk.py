"""Filling a file system, for tests of a full disk."""

from __future__ import annotations

import contextlib
import os
import pathlib


def fill(directory: pathlib.Path) -> pathlib.Path:
    """Take every free byte of ``directory``'s file system; returns the ballast file."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: go on smaller, to the last byte
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return ballast
