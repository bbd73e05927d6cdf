"""Mounting: options, a stale mount left by a crash, the kernel's read-ahead, unmount.

`serve_mount` runs the FUSE session inside the daemon's trio loop until it
is cancelled, then unmounts. pyfuse3 keeps one session per process, which
is all a daemon needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import pathlib
import threading

import pyfuse3
import trio

from fs.operations import SegmentFS
from fs.passthrough import Passthrough
from fs.segment_source import SegmentFiles, SegmentSource
from gateway.config import Config
from gateway.errors import MountError
from gateway.stats import resident_bytes

log = logging.getLogger(__name__)

FSNAME = "segment-gateway"
MNT_DETACH = 2
#: Under ``node.data_dir``: the segment files passthrough serves (`cache.segment_files`).
SEGMENT_FILES_DIR = "segment-files"
#: How long a mount in the way may take to answer before it counts as hung.
STALE_PROBE_TIMEOUT = 2.0


def mount_options(config: Config) -> set[str]:
    """The options the mount gets (DESIGN.md): read-only, kernel permission checks."""
    options = {
        "ro",
        "default_permissions",
        "noatime",
        f"fsname={FSNAME}",
        f"subtype={FSNAME}",
    }
    if config.fuse.allow_other:
        options.add("allow_other")
    return options


def _mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, major:minor, filesystem type) of every mount, in mount order."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            point = fields[4].encode().decode("unicode_escape")
            out.append((point, fields[2], fields[sep + 1]))
    return out


def mounted_at(path: str) -> tuple[str, str] | None:
    """(major:minor, type) of the topmost mount at ``path``, or None."""
    found = None
    for point, device, fstype in _mountinfo():
        if point == path:
            found = (device, fstype)
    return found


def _probe(path: str) -> int:
    """0 if the mount at ``path`` answers a stat, else the errno (ETIMEDOUT if hung)."""
    result: list[int] = []

    def run() -> None:
        try:
            os.stat(path)
            result.append(0)
        except OSError as e:
            result.append(e.errno or errno.EIO)

    # A plain thread, abandoned if it hangs: a stat on a hung FUSE mount
    # blocks until the connection is aborted, which a worker pool would feel.
    t = threading.Thread(target=run, daemon=True, name="stale-mount-probe")
    t.start()
    t.join(STALE_PROBE_TIMEOUT)
    return result[0] if result else errno.ETIMEDOUT


def lazy_unmount(path: str) -> None:
    """Detach the mount at ``path`` (umount -l)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def prepare_mountpoint(path: str) -> None:
    """Make ``path`` ready to mount on: create it, clear a stale mount, refuse a live one.

    A daemon killed with its mount in place leaves a dead FUSE mount that
    answers everything with ENOTCONN (or hangs if its connection is stuck);
    it is detached. A mount that still answers belongs to someone else.
    """
    found = mounted_at(path)
    if found is not None:
        device, fstype = found
        problem = _probe(path)
        if problem in (errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNABORTED):
            log.warning(
                "mountpoint %s: clearing a stale %s mount (%s)",
                path,
                fstype,
                os.strerror(problem),
            )
            _abort_connection(device)
            try:
                lazy_unmount(path)
            except OSError as e:
                raise MountError(path, f"cannot clear the stale mount: {e.strerror}") from None
        elif mounted_at(path) is not None:
            raise MountError(
                path, f"a live {fstype} filesystem is mounted there; unmount it or pick another"
            )
    try:
        # 0755 whatever the umask: the daemon's is 077 (its files are
        # private), but readers must be able to reach the mount.
        target = pathlib.Path(path)
        for d in reversed([p for p in (target, *target.parents) if not p.exists()]):
            d.mkdir(exist_ok=True)
            d.chmod(0o755)
    except OSError as e:
        raise MountError(path, f"cannot create the mountpoint: {e.strerror}") from None


def _abort_connection(device: str) -> None:
    """Abort the FUSE connection of a hung mount, so nothing waits on it any more."""
    minor = device.partition(":")[2]
    abort = pathlib.Path(f"/sys/fs/fuse/connections/{minor}/abort")
    with contextlib.suppress(OSError):  # already gone, or not a FUSE mount
        abort.write_text("1")


def set_read_ahead(path: str, kib: int) -> None:
    """Set the kernel's read-ahead for the mount at ``path`` (its bdi).

    FUSE mounts start at 128 KiB, so a sequential reader sends requests of
    128 KiB one or two at a time; a larger window lets the kernel send
    1 MiB requests, several at once. Best effort: needs root.
    """
    found = mounted_at(path)
    if found is None or kib <= 0:
        return
    bdi = pathlib.Path(f"/sys/class/bdi/{found[0]}/read_ahead_kb")
    try:
        bdi.write_text(str(kib))
    except OSError as e:
        log.info("cannot set the mount's read-ahead to %d KiB (%s): %s", kib, bdi, e.strerror)


def open_segment_files(config: Config) -> SegmentFiles | None:
    """The segment files for passthrough, if configured and possible (blocking: a
    worker thread lists the directory).

    Possible: pyfuse3 has passthrough (scripts/build_pyfuse3.sh); whether the
    kernel grants it is known at INIT.
    """
    if not config.fuse.passthrough:
        return None
    if not hasattr(pyfuse3, "backing_open"):
        log.info("FUSE passthrough: this pyfuse3 cannot do it; the daemon serves reads")
        return None
    directory = pathlib.Path(config.node.data_dir) / SEGMENT_FILES_DIR
    budget = config.fuse.passthrough_budget
    if not budget:
        directory.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(directory)
        budget = max(64 * 1024 * 1024, min(4 * 1024**3, st.f_bavail * st.f_frsize // 4))
    files = SegmentFiles(directory, budget)
    files.start()
    return files


def open_passthrough(source: SegmentSource, files: SegmentFiles) -> Passthrough:
    """Passthrough over ``files``, keeping only the files whose segment is still the same.

    On the event loop's thread, which owns the segments (a lookup may warm a
    cold one), right before the caller watches the source, so that no
    truncation or deletion falls between the two.
    """
    passthrough = Passthrough(source, files, pyfuse3.backing_open, pyfuse3.backing_close)
    files.retain(passthrough.current)
    return passthrough


async def serve_mount(
    source: SegmentSource,
    config: Config,
    *,
    task_status: trio.TaskStatus[SegmentFS] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mount ``source``'s segments at ``fuse.mountpoint`` until cancelled; then unmount."""
    path = config.fuse.mountpoint  # absolute: the configuration insists
    await trio.to_thread.run_sync(prepare_mountpoint, path)
    files = await trio.to_thread.run_sync(open_segment_files, config)
    ops = SegmentFS(
        source,
        config.fuse,
        config.tier2.read_ahead * 1024 * 1024,
        open_passthrough(source, files) if files is not None else None,
    )
    try:
        pyfuse3.init(ops, path, mount_options(config))
    except RuntimeError as e:
        raise MountError(path, f"{e} (is /dev/fuse available, and fuse3 installed?)") from None
    source.watch(ops.vfs)
    if ops.passthrough is not None:
        source.watch(ops.passthrough)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.run_invalidations)
            if ops.passthrough is not None:
                nursery.start_soon(ops.passthrough.run)
            nursery.start_soon(pyfuse3.main)
            with trio.move_on_after(10):
                await ops.initialized.wait()
            # INIT has been answered (it set the kernel's read-ahead to its
            # default); now the bdi can take ours.
            await trio.to_thread.run_sync(set_read_ahead, path, config.fuse.read_ahead_kb)
            log.info(
                "mounted %d segment(s) at %s (resident memory %d MiB)",
                source.totals()[1],
                path,
                resident_bytes() >> 20,
            )
            task_status.started(ops)
            await trio.sleep_forever()
    finally:
        source.unwatch(ops.vfs)
        if ops.passthrough is not None:
            source.unwatch(ops.passthrough)
        # Lazily, with umount2 itself: files still open keep the old mount
        # alive for their readers while the path is free again, and a
        # non-root daemon with CAP_SYS_ADMIN (the systemd unit) needs no
        # setuid fusermount3, which NoNewPrivileges would disarm anyway.
        try:
            lazy_unmount(path)
            log.info("unmounted %s", path)
        except OSError as e:
            log.warning("cannot unmount %s: %s (umount -l it by hand)", path, e.strerror)
        pyfuse3.close(unmount=False)
