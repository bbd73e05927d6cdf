"""Filling a file system, for tests of a full disk."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest


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


@contextlib.contextmanager
def tmpfs(mnt: pathlib.Path, size: str) -> Iterator[pathlib.Path]:
    """A tmpfs of ``size`` (e.g. ``"8m"``) at ``mnt``, unmounted lazily afterwards.

    Skips the test where it cannot be mounted (not root, no mount permission),
    so a journal can run out of space for real where it can.
    """
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir(exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
    if subprocess.run(mount, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
