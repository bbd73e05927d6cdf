#!/usr/bin/env python3
"""A pyfuse3 file system of one read-only file, served by the daemon or by FUSE passthrough.

The smallest shape of what the gateway's mount would do for a sealed segment
kept as a local file: ``lookup``/``getattr`` of one file ``segment`` that
mirrors ``SOURCE``, ``open`` returning either a handle the daemon reads with
``os.pread`` (``--mode daemon``, ``keep_cache`` as the gateway sets for sealed
segments) or a backing id (``--mode passthrough``: the kernel reads the file
itself). Needs pyfuse3 with the passthrough patch
(``packaging/patches/pyfuse3-3.5.0-passthrough.patch``) built against
libfuse >= 3.16; the project's own pyfuse3 does not have it. Runs until the
mount is unmounted, then prints what it served as one JSON line on stdout
(``read_requests`` must stay 0 in passthrough mode). It imports nothing from
the project, so it runs in the venv that has the patched pyfuse3
(``bench/passthrough_probe.py --pyfuse3-python``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
from typing import Any

import pyfuse3
import trio

FILE_INODE = pyfuse3.ROOT_INODE + 1
NAME = b"segment"
#: Sealed segments never change: the kernel may keep names and attributes long.
TIMEOUT = 3600.0
#: pyfuse3 with the patch: its additions are not in pyfuse3's type stubs.
PATCHED: Any = pyfuse3


class OneFile(pyfuse3.Operations):
    """``/segment``, the bytes of ``source``."""

    def __init__(self, source: str, passthrough: bool) -> None:
        super().__init__()
        self.enable_passthrough = passthrough
        self.source = source
        self.size = os.stat(source).st_size
        self.passthrough = passthrough
        # One backing id per inode, shared by its opens: the kernel refuses a
        # second, different backing file for an inode that has one in use.
        self.backing_id = 0
        self.open_handles = 0
        self.stats = {"read_requests": 0, "read_bytes": 0, "backing_opened": 0, "opens": 0}

    def _attributes(self, inode: int) -> Any:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.attr_timeout = entry.entry_timeout = TIMEOUT
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode = stat.S_IFDIR | 0o555
            entry.st_nlink = 2
        else:
            entry.st_mode = stat.S_IFREG | 0o444
            entry.st_nlink = 1
            entry.st_size = self.size
        entry.st_blksize = 4096
        return entry

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        if inode not in (pyfuse3.ROOT_INODE, FILE_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(inode)

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        if parent_inode != pyfuse3.ROOT_INODE or name != NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(FILE_INODE)

    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fd = os.open(self.source, os.O_RDONLY)
        self.stats["opens"] += 1
        self.open_handles += 1
        if not self.passthrough:
            return pyfuse3.FileInfo(fh=fd, keep_cache=True)
        if not self.backing_id:
            try:
                self.backing_id = PATCHED.backing_open(fd)
            except OSError as e:
                os.close(fd)
                self.open_handles -= 1
                raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
            self.stats["backing_opened"] += 1
        return PATCHED.FileInfo(fh=fd, backing_id=self.backing_id)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        self.stats["read_requests"] += 1
        data = os.pread(fh, size, off)
        self.stats["read_bytes"] += len(data)
        return data

    async def release(self, fh: int) -> None:
        os.close(fh)
        self.open_handles -= 1
        if self.backing_id and not self.open_handles:
            # The kernel keeps its own reference while a file is open with it;
            # dropping the id at the last release keeps the id table small.
            PATCHED.backing_close(self.backing_id)
            self.backing_id = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--mode", choices=("daemon", "passthrough"), required=True)
    args = parser.parse_args()
    fs = OneFile(args.source, args.mode == "passthrough")
    options = set(pyfuse3.default_options) | {"fsname=passthrough-poc", "ro"}
    pyfuse3.init(fs, args.mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
    granted = bool(getattr(pyfuse3, "passthrough_enabled", lambda: False)())
    print(json.dumps({**fs.stats, "passthrough_granted": granted}), flush=True)


if __name__ == "__main__":
    main()
