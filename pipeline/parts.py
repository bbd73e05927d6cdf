"""Parts of mounted segments and how their events are read (both `segments` sources).

A part is a byte range of one segment file; `framed_events` and
`line_events` turn one into Arrow record batches of ``segment``,
``offset``, ``event`` and ``sealed``, reading through the mount. The batch
source (`pipeline.source`) and the streaming source (`pipeline.stream`)
plan parts; Spark's executors read them with these functions. The rules
(event-index splits for framed events, Hadoop's line rule for lines) are
described in `pipeline.source`.
"""

from __future__ import annotations

import errno
import io
import os
import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, cast

from pyspark.sql.datasource import InputPartition

DEFAULT_SPLIT = 128 * 1024 * 1024
_LENGTH = struct.Struct(">I")
#: The offsets buffer of a one-value Arrow ``large_binary`` array.
_ONE_VALUE = struct.Struct("=2q")
#: The same for a ``binary`` array (32-bit offsets).
_ONE_VALUE32 = struct.Struct("=2i")
#: Bytes read from the mount at once: the gateway's prefetcher sees a
#: sequential reader, and a Python loop over events stays cheap.
READ_BUFFER = 4 * 1024 * 1024
#: Events are handed to Spark as Arrow record batches of about this many bytes.
BATCH_BYTES = 8 * 1024 * 1024
#: A lines part reads this many bytes at a time into one reused buffer;
#: the whole lines of each read are one record batch. Batches of 1 MiB cost
#: the JVM less CPU to take in than 4 or 8 MiB (measured with `local[2]`).
LINES_BLOCK = 1024 * 1024
#: A lines part looks for the end of its first or last line this much at a
#: time (doubling up to `BATCH_BYTES`): most lines are short, so a part
#: reads little beyond its own bytes.
SCAN_BYTES = 64 * 1024
#: The filesystem type of the gateway's mount in ``/proc/self/mountinfo``
#: (``fuse.`` and the subtype fs/mount.py gives it).
MOUNT_TYPE = "fuse.segment-gateway"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"134217728"``, ``"128m"``, ``"1g"`` (Spark's size strings)."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS and t[-1].isalpha() else (t, "")
    return int(float(number) * _UNITS[unit])


def parse_bool(text: str) -> bool:
    """An option's truth: true, 1 or yes."""
    return text.strip().lower() in ("true", "1", "yes")


def _mounts() -> list[tuple[str, str, str]]:
    """(mount id, mount point, filesystem type) of every mount, in mount order."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            # Space, tab, newline and backslash are octal escapes ("\040").
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((fields[0], point, fields[sep + 1]))
    return out


def gateway_mount(path: str) -> str | None:
    """The mount point of the gateway's mount that holds ``path``, or None.

    Found in the mount table, so a mount whose daemon died (it answers
    ENOTCONN until the next start clears it) still counts: the name of a
    segment is its path under this point whatever state the mount is in.
    """
    p = os.path.abspath(path)
    best = None
    for _, point, fstype in _mounts():
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if fstype == MOUNT_TYPE and inside and (best is None or len(point) > len(best)):
            best = point
    return best


def mount_root(path: str) -> str:
    """The mountpoint above ``path`` (segment names are relative to it)."""
    found = gateway_mount(path)
    if found is not None:
        return found
    p = os.path.abspath(path)
    while not os.path.ismount(p) and p != "/":
        p = os.path.dirname(p)
    return p


class MountUnavailable(OSError):
    """The gateway's mount cannot be read now: its daemon is down or restarting."""


def check_mount(root: str) -> str:
    """The id of the live gateway mount at ``root``; `MountUnavailable` if there is none.

    Live: the topmost mount at ``root`` is the gateway's and answers. A
    daemon killed leaves its mount in place answering ENOTCONN; while the
    next start clears it and mounts again, ``root`` is a plain directory for
    a moment. What such a mount lists is not what the gateway holds.
    """
    top = None
    for mount_id, point, fstype in _mounts():
        if point == root:
            top = (mount_id, fstype)
    if top is None or top[1] != MOUNT_TYPE:
        what = "nothing" if top is None else f"a {top[1]} filesystem"
        raise MountUnavailable(errno.ENOTCONN, f"no segment-gateway mount at {root} ({what})")
    try:
        os.statvfs(root)
    except OSError as e:
        problem = f"the segment-gateway mount at {root} does not answer: {e.strerror}"
        raise MountUnavailable(e.errno or errno.EIO, problem) from None
    return top[0]


def _vanished(e: OSError) -> None:
    """``os.walk``'s error handler: a directory deleted while listed is skipped, no more."""
    if e.errno not in (errno.ENOENT, errno.ESTALE):
        raise e


def list_segment_files(path: str) -> list[str]:
    """Segment files at or under ``path``, sorted; hidden and ``_`` names skipped.

    A directory that cannot be read (a mount that does not answer) is an
    error, not an empty directory; one deleted while listed is skipped.
    """
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    found: list[str] = []
    for directory, dirs, files in os.walk(path, onerror=_vanished):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found.extend(
            os.path.join(directory, f) for f in sorted(files) if not f.startswith((".", "_"))
        )
    return found


def declared_codec(file: str) -> str:
    """The segment's own codec if it declared lines or framed, else framed."""
    try:
        codec = os.getxattr(file, "user.segment.codec").decode()
    except OSError:
        return "framed"
    return codec if codec in ("lines", "framed") else "framed"


def read_event_index(file: str) -> list[int]:
    """The offsets in the segment's ``.NAME.events`` file (empty if there is none)."""
    directory, base = os.path.split(file)
    try:
        with open(os.path.join(directory, f".{base}.events"), "rb") as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


class Part(InputPartition):
    """Bytes from ``start`` to ``end`` of one segment file (the kinds below say how)."""

    def __init__(self, file: str, segment: str, start: int, end: int, sealed: bool) -> None:
        super().__init__((segment, start))
        self.file = file
        self.segment = segment
        self.start = start
        self.end = end
        self.sealed = sealed
        #: The segment's creation time (Unix ms) and owner when the part was
        #: planned (0 and "": not known), to tell its deletion from a mount
        #: that does not show it for a moment.
        self.created = 0
        self.node = ""
        #: Read with O_DIRECT: the mount then serves every byte up to the
        #: segment's current end, where the kernel's copy of the size (kept
        #: up to ``fuse.active_timeout``) could cut a growing file short.
        #: The streaming source sets it for active segments.
        self.direct = False

    def open(self, buffering: int) -> BinaryIO:
        """The segment file, opened for this part."""
        if not self.direct:
            return open(self.file, "rb", buffering=buffering)
        fd = os.open(self.file, os.O_RDONLY | os.O_DIRECT)
        return os.fdopen(fd, "rb", buffering=buffering)


class SegmentPart(Part):
    """Bytes ``[start, end)`` of one segment file, both event boundaries.

    Events starting in ``[lo, hi)`` are returned; ``start <= lo``.
    """

    def __init__(
        self, file: str, segment: str, start: int, end: int, lo: int, hi: int, sealed: bool
    ) -> None:
        super().__init__(file, segment, start, end, sealed)
        self.lo = lo
        self.hi = hi


class LinesPart(Part):
    """The lines that start in ``[start, end)`` of one segment file.

    ``head``: a line is known to start at ``start`` (the segment's first
    byte, or an indexed start offset); otherwise the first line starts after
    the first newline at or after ``start - 1``. ``length`` is the
    segment's length at listing time: the last line is read through its
    newline, up to there. ``complete``: ``length`` is the sealed segment's
    final length, so a last line without a newline is whole, and returned.
    """

    def __init__(
        self,
        file: str,
        segment: str,
        start: int,
        end: int,
        length: int,
        head: bool,
        sealed: bool,
        complete: bool,
    ) -> None:
        super().__init__(file, segment, start, end, sealed)
        self.length = length
        self.head = head
        self.complete = complete


def split(index: Sequence[int], start: int, end: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut at indexed boundaries once a part reaches ``size`` bytes."""
    parts = []
    i = 0
    while start < end:
        target = start + size
        while i < len(index) and index[i] < target:
            i += 1
        cut = index[i] if i < len(index) and index[i] < end else end
        parts.append((start, cut))
        start = cut
    return parts


def _batch(p: Part, offsets: Any, events: Any) -> Any:
    """One Arrow record batch of events (Spark moves these without per-row work)."""
    import pyarrow as pa

    n = len(events)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(p.segment, pa.string()), n),
            offsets,
            events,
            pa.repeat(pa.scalar(p.sealed, pa.bool_()), n),
        ],
        names=["segment", "offset", "event", "sealed"],
    )


def framed_events(p: SegmentPart) -> Iterator[Any]:
    """Length-prefixed events, parsed in Python, handed over in batches of ~8 MiB."""
    import pyarrow as pa

    with p.open(READ_BUFFER) as f:
        f.seek(p.start)
        offset = p.start
        offsets: list[int] = []
        events: list[bytes] = []
        size = 0
        while offset < p.end and offset < p.hi:
            head = f.read(4)
            if len(head) < 4:
                raise OSError(f"{p.segment}: event at {offset} cut short (length prefix)")
            (n,) = _LENGTH.unpack(head)
            event = f.read(n)
            if len(event) < n:
                raise OSError(f"{p.segment}: event at {offset} cut short ({len(event)} of {n})")
            if offset >= p.lo:
                offsets.append(offset)
                events.append(event)
                size += n
                if size >= BATCH_BYTES:
                    yield _batch(p, pa.array(offsets, pa.int64()), pa.array(events, pa.binary()))
                    offsets, events, size = [], [], 0
            offset += 4 + n
        if events:
            yield _batch(p, pa.array(offsets, pa.int64()), pa.array(events, pa.binary()))


def _first_line(f: BinaryIO, p: LinesPart) -> int | None:
    """Where the first line starting in ``[p.start, p.end)`` starts, or None.

    Hadoop's rule: skip up to and including the first newline at or after
    ``start - 1`` (a newline just before ``start`` means a line starts
    exactly there).
    """
    if p.head:
        return p.start
    pos = p.start - 1
    f.seek(pos)
    step = SCAN_BYTES
    while pos < p.end - 1:  # a newline at end - 1 or later starts no line of ours
        block = f.read(min(step, p.end - 1 - pos))
        if not block:
            raise OSError(f"{p.segment}: ends at {pos}, before {p.length}")
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
        step = min(2 * step, BATCH_BYTES)
    return None


def _one_value(data: bytes | bytearray, n: int) -> Any:
    """A one-value Arrow binary array over ``data[:n]``, without copying it."""
    import pyarrow as pa

    if n < 2**31:
        offsets = pa.py_buffer(_ONE_VALUE32.pack(0, n))
        return pa.BinaryArray.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(data)])
    offsets = pa.py_buffer(_ONE_VALUE.pack(0, n))
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)]
    )


def _lines_batch(p: LinesPart, base: int, block: bytearray, cut: int) -> Any:
    """The lines of ``block[:cut]`` (which ends with a newline, at ``base``) as a batch.

    One pass of Arrow's ``split_pattern`` copies the lines, without their
    newlines, into one data buffer and gives their offsets in it; a line's
    offset in the segment is its offset there plus the newlines before it.
    Lines starting at or after the part's end are the next part's.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = pc.split_pattern(_one_value(block, cut - 1), b"\n").values
    if lines.type != pa.binary():  # a block of 2 GiB or more (one huge line)
        lines = lines.cast(pa.binary())
    n = len(lines)
    within = np.frombuffer(lines.buffers()[1], np.int32, n, lines.offset * 4)
    starts = within + np.arange(base, base + n, dtype=np.int64)
    if base + cut > p.end:
        keep = int(np.searchsorted(starts, p.end))
        lines, starts = lines.slice(0, keep), starts[:keep]
    return _batch(p, pa.array(starts), lines)


def line_events(p: LinesPart) -> Iterator[Any]:
    """The lines starting in the part, split by Arrow (no Python loop per line).

    The part is read in blocks of `LINES_BLOCK` bytes into one buffer,
    reused: each block's whole lines become one record batch (their bytes
    copied once, by the split), and the unfinished line at its end moves to
    the front of the buffer for the next read. A line longer than the
    buffer doubles it.
    """
    with p.open(0) as f:
        base = _first_line(f, p)
        if base is None:
            return
        f.seek(base)
        block = bytearray(LINES_BLOCK)
        view = memoryview(block)
        carry = 0  # block[:carry]: the start of the line at base, not ended yet
        step = SCAN_BYTES
        while base < p.end:
            have = base + carry
            if have >= p.length:
                if carry and p.complete:  # the last line, without a newline
                    yield _batch(p, _int64([base]), _one_value(bytes(view[:carry]), carry))
                return
            if carry == len(block):  # a line longer than the buffer
                view.release()
                block = block + bytes(len(block))
                view = memoryview(block)
            if have < p.end:
                want = min(len(block) - carry, p.end - have)
            else:  # past the end: only the rest of the last line is wanted
                want = min(len(block) - carry, step, p.length - have)
                step = min(2 * step, LINES_BLOCK)
            got = cast(io.RawIOBase, f).readinto(view[carry : carry + want])
            if not got:
                raise OSError(f"{p.segment}: ends at {have}, before {p.length}")
            total = carry + got
            cut = block.rfind(b"\n", carry, total) + 1
            if not cut:
                carry = total
                continue
            yield _lines_batch(p, base, block, cut)
            view[: total - cut] = view[cut:total]
            carry = total - cut
            base += cut


def _int64(values: list[int]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.int64())
