"""The ``segments`` data source: one row per event of the segments under a mounted path.

``spark.read.format("segments").load("/mnt/scope/stream")`` lists the
segment files under the path (as Spark's own file sources do: names starting
with ``.`` or ``_`` are skipped), and gives one row per event with the
columns ``segment`` (the segment's name), ``offset`` (where the event starts
in it), ``event`` (its bytes) and ``sealed``.

Everything comes through the mount, so a Spark task on any node with the
mount reads the same bytes the gateway serves: lengths from ``stat`` (the
committed length at listing time: later appends are not read), the start
offset and sealed flag from the ``user.segment.*`` xattrs, and event
boundaries from the hidden ``.NAME.events`` file (about one per MiB).

``framed`` segments are cut into partitions at indexed event boundaries
once a part reaches ``splitSize`` bytes (default 128 MiB, Spark's
``maxPartitionBytes``), so an event never straddles two tasks, and one
event larger than the split size is a part of its own. Below the start
offset (truncated) nothing is read: the first part starts at the first
indexed boundary at or after it, so events between a truncation offset that
is not itself indexed and the next indexed boundary (less than ~1 MiB) are
not returned.

``lines`` segments do not use the index to find lines: an indexed offset is
where an append began, and raw appends begin mid-line. They are cut every
``splitSize`` bytes and read by Hadoop's ``LineRecordReader`` rule: a line
belongs to the part in which it starts, a line starts after a newline (or
at the start of the segment), and a part reads on past its end to finish
its last line. A truncated segment's first line starts at the start offset
when that offset is indexed (it was an append boundary); otherwise the
bytes up to the first newline after it are the tail of a cut line and are
skipped. A last line without a newline is returned once the segment is
sealed; while it is active that line may be half written, so it waits.

Options:

- ``codec``: ``framed`` (4-byte big-endian length, then the event) or
  ``lines`` (each event ends with ``\\n``, which is not part of it; a
  ``\\r`` before it is); by default each segment's own codec
  (``user.segment.codec``: what it was created with), else ``framed``;
- ``startOffset`` / ``endOffset``: only events starting in that range of
  each segment;
- ``includeActive``: ``true`` (default) also reads segments not yet sealed;
- ``splitSize``: bytes per partition (a size such as ``64m`` or bytes).

- ``pushFilters``: ``true`` to have filters on ``segment`` (=, IN, starts
  with) and ``offset`` (=, <, <=, >, >=) pushed down, choosing segments and
  byte ranges before anything is read. It needs the session setting
  ``spark.sql.python.filterPushdown.enabled=true`` (`pipeline.session`
  sets it): Spark refuses a Python source that can take filters while that
  setting is off, its default, so pushdown is asked for explicitly.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.types import StructType

SCHEMA = "segment string, offset long, event binary, sealed boolean"
DEFAULT_SPLIT = 128 * 1024 * 1024
_LENGTH = struct.Struct(">I")
#: The offsets buffer of a one-value Arrow ``large_binary`` array.
_ONE_VALUE = struct.Struct("=2q")
#: Bytes read from the mount at once: the gateway's prefetcher sees a
#: sequential reader, and a Python loop over events stays cheap.
READ_BUFFER = 4 * 1024 * 1024
#: Events are handed to Spark as Arrow record batches of about this many bytes.
BATCH_BYTES = 8 * 1024 * 1024
#: A lines part looks for the end of its first or last line this much at a
#: time (doubling up to `BATCH_BYTES`): most lines are short, so a part
#: reads little beyond its own bytes.
SCAN_BYTES = 64 * 1024
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"134217728"``, ``"128m"``, ``"1g"`` (Spark's size strings)."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS and t[-1].isalpha() else (t, "")
    return int(float(number) * _UNITS[unit])


def _bool(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")


def mount_root(path: str) -> str:
    """The mountpoint above ``path`` (segment names are relative to it)."""
    p = os.path.abspath(path)
    while not os.path.ismount(p) and p != "/":
        p = os.path.dirname(p)
    return p


def list_segment_files(path: str) -> list[str]:
    """Segment files at or under ``path``, sorted; hidden and ``_`` names skipped."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    found: list[str] = []
    for directory, dirs, files in os.walk(path):
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


class SegmentsReader(DataSourceReader):
    """Plans parts of segments and reads their events (no filter pushdown)."""

    def __init__(self, given: dict[str, str]) -> None:
        # Spark's option names are case-insensitive (and may arrive lowercased).
        options = {k.lower(): v for k, v in given.items()}
        self.path = options.get("path", "")
        if not self.path:
            raise ValueError('segments: give a path: spark.read.format("segments").load(PATH)')
        #: "" means each segment's own (``user.segment.codec``), else framed.
        self.codec = options.get("codec", "")
        if self.codec not in ("", "framed", "lines"):
            raise ValueError(f"segments: codec must be framed or lines, not {self.codec!r}")
        self.lo = int(options.get("startoffset", 0))
        self.hi = int(options.get("endoffset", 2**63 - 1))
        self.include_active = _bool(options.get("includeactive", "true"))
        self.split_size = max(1, parse_size(options.get("splitsize", str(DEFAULT_SPLIT))))
        self.names: set[str] | None = None
        self.prefixes: list[str] = []

    def take_filters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Take the filters on ``segment`` and ``offset`` this source applies exactly."""
        for f in filters:
            path: tuple[str, ...] = getattr(f, "attribute", ())  # a column path: ("segment",)
            column = path[0] if len(path) == 1 else None
            if column == "segment" and isinstance(f, EqualTo | In) and self._names(f):
                continue
            if column == "segment" and isinstance(f, StringStartsWith):
                self.prefixes.append(f.value)
                continue
            if column == "offset" and self._offsets(f):
                continue
            yield f

    def _names(self, f: EqualTo | In) -> bool:
        values = {f.value} if isinstance(f, EqualTo) else set(f.value)
        if not all(isinstance(v, str) for v in values):
            return False
        self.names = values if self.names is None else self.names & values
        return True

    def _offsets(self, f: Filter) -> bool:
        value = getattr(f, "value", None)
        if not isinstance(value, int):
            return False
        if isinstance(f, EqualTo):
            self.lo, self.hi = max(self.lo, value), min(self.hi, value + 1)
        elif isinstance(f, GreaterThan):
            self.lo = max(self.lo, value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            self.lo = max(self.lo, value)
        elif isinstance(f, LessThan):
            self.hi = min(self.hi, value)
        elif isinstance(f, LessThanOrEqual):
            self.hi = min(self.hi, value + 1)
        else:
            return False
        return True

    def _wanted(self, segment: str) -> bool:
        if self.names is not None and segment not in self.names:
            return False
        return all(segment.startswith(p) for p in self.prefixes)

    def partitions(self) -> Sequence[InputPartition]:
        """Parts of every wanted segment, cut at indexed event boundaries."""
        root = mount_root(self.path)
        parts: list[InputPartition] = []
        for file in list_segment_files(self.path):
            segment = os.path.relpath(file, root)
            if not self._wanted(segment):
                continue
            # Sealed before the length: a segment seen sealed has its final
            # length, so its last line is whole even without a newline --
            # unless the kernel's copy of the size is older than the seal.
            sealed = os.getxattr(file, "user.segment.sealed") == b"1"
            if not sealed and not self.include_active:
                continue
            final = int(os.getxattr(file, "user.segment.length")) if sealed else -1
            length = os.stat(file).st_size
            start_offset = int(os.getxattr(file, "user.segment.start_offset"))
            index = [b for b in read_event_index(file) if b >= start_offset]
            lo, hi = max(self.lo, start_offset), min(self.hi, length)
            if (self.codec or declared_codec(file)) == "lines":
                # Below the start offset are zeros: whether a line starts
                # at it is known only if it is an indexed (append) boundary.
                head = lo == 0 or (lo == start_offset and start_offset in index)
                complete = length == final
                for a in range(lo, hi, self.split_size):
                    b = min(a + self.split_size, hi)
                    first = head and a == lo
                    parts.append(LinesPart(file, segment, a, b, length, first, sealed, complete))
                continue
            if lo >= hi or not index:
                continue
            # Parsing starts at an indexed boundary: the last at or below lo.
            k = max(0, next((i for i, b in enumerate(index) if b > lo), len(index)) - 1)
            start = index[k]
            if start > lo:  # lo is below the first boundary (truncated mid-event)
                lo = start
            for a, b in split(index[k:], start, length, self.split_size):
                if b > lo and a < hi:
                    parts.append(SegmentPart(file, segment, a, b, max(lo, a), min(hi, b), sealed))
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The events of one part, as Arrow record batches."""
        if isinstance(partition, LinesPart):
            return _lines(partition)
        if isinstance(partition, SegmentPart):
            return _framed(partition)
        return iter(())


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


def _framed(p: SegmentPart) -> Iterator[Any]:
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

    offsets = pa.py_buffer(_ONE_VALUE.pack(0, n))
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)]
    )


def _lines(p: LinesPart) -> Iterator[Any]:
    """The lines starting in the part, split by Arrow (no Python loop per line)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with p.open(0) as f:
        base = _first_line(f, p)
        if base is None:
            return
        f.seek(base)
        # The bytes read from base (a line start) on, up to the last newline
        # seen. Never changed once Arrow holds it: replaced, not trimmed.
        pending = bytearray()
        step = SCAN_BYTES
        while base < p.end:
            have = base + len(pending)
            if have >= p.length:
                if pending and p.complete:  # the last line, without a newline
                    yield _batch(
                        p,
                        pa.array([base], pa.int64()),
                        _one_value(pending, len(pending)).cast(pa.binary()),
                    )
                return
            if have < p.end:
                want = min(BATCH_BYTES, p.end - have)
            else:  # past the end: only the rest of the last line is wanted
                want = min(step, p.length - have)
                step = min(2 * step, BATCH_BYTES)
            chunk = f.read(want)
            if not chunk:
                raise OSError(f"{p.segment}: ends at {have}, before {p.length}")
            searched = len(pending)
            data: bytes | bytearray = chunk
            if pending:
                pending += chunk
                data = pending
            cut = data.rfind(b"\n", searched) + 1
            if not cut:
                if data is chunk:
                    pending = bytearray(chunk)
                continue
            lines = pc.split_pattern(_one_value(data, cut), b"\n").values
            lines = lines.slice(0, len(lines) - 1)  # the empty piece after the last newline
            sizes = pc.add(pc.binary_length(lines).cast(pa.int64()), 1)
            starts = pc.add(pc.subtract(pc.cumulative_sum(sizes), sizes), base)
            if base + cut > p.end:  # lines starting at or past the end are the next part's
                keep = pc.less(starts, p.end)
                lines, starts = lines.filter(keep), starts.filter(keep)
            yield _batch(p, starts, lines.cast(pa.binary()))
            pending = bytearray(data[cut:])
            base += cut


class PushdownSegmentsReader(SegmentsReader):
    """`SegmentsReader` that takes filters (option ``pushFilters=true``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Filters on ``segment`` and ``offset`` are applied here; the rest are Spark's."""
        return list(self.take_filters(filters))


class SegmentsDataSource(DataSource):
    """``spark.read.format("segments")``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "segments"

    def schema(self) -> str:
        """segment, offset, event, sealed."""
        return SCHEMA

    def reader(self, schema: StructType) -> SegmentsReader:
        """A reader for ``self.options``."""
        options = {k.lower(): v for k, v in self.options.items()}
        if _bool(options.get("pushfilters", "false")):
            return PushdownSegmentsReader(options)
        return SegmentsReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("segments")``: `pipeline.stream.SegmentsStreamReader`."""
        from pipeline.stream import SegmentsStreamReader

        return SegmentsStreamReader(self.options)
