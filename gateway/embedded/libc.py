"""The two libc calls Python does not offer: ``prctl(PR_SET_PDEATHSIG)`` and ``syncfs``.

Both are resolved at import, in the parent: the child between fork and exec
should run as little Python as possible (no imports, no lookups).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["set_parent_death_signal", "sync_filesystem"]

_PR_SET_PDEATHSIG = 1


def _libc_function(name: str) -> Callable[..., int] | None:
    """A libc function by name (Linux only), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    return function


_prctl = _libc_function("prctl")
_syncfs = _libc_function("syncfs")


def set_parent_death_signal() -> None:
    """In the child, before exec: die with SIGKILL when the starting thread ends (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def sync_filesystem(fd: int) -> int:
    """``syncfs(fd)``: flush the filesystem holding ``fd``; 0, or the errno it failed with.

    Not on Linux: ``sync()``, everything, everywhere.
    """
    if _syncfs is None:
        os.sync()
        return 0
    if _syncfs(fd) != 0:
        return ctypes.get_errno()
    return 0
