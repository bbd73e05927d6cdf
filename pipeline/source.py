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
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

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

from pipeline.parts import (
    DEFAULT_SPLIT,
    LinesPart,
    SegmentPart,
    declared_codec,
    framed_events,
    line_events,
    list_segment_files,
    mount_root,
    parse_bool,
    parse_size,
    read_event_index,
    split,
)

SCHEMA = "segment string, offset long, event binary, sealed boolean"


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
        self.include_active = parse_bool(options.get("includeactive", "true"))
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
            return line_events(partition)
        if isinstance(partition, SegmentPart):
            return framed_events(partition)
        return iter(())


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
        if parse_bool(options.get("pushfilters", "false")):
            return PushdownSegmentsReader(options)
        return SegmentsReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("segments")``: `pipeline.stream.SegmentsStreamReader`."""
        from pipeline.stream import SegmentsStreamReader

        return SegmentsStreamReader(self.options)
