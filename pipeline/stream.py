"""The streaming ``segments`` source: Structured Streaming over growing segments.

``spark.readStream.format("segments").option("path", MOUNT + "/clicks").load()``
gives the rows of the batch source (`pipeline.source`: ``segment``,
``offset``, ``event``, ``sealed``) as they are appended. Spark's own file
source cannot do this: it reads a file once, when it first lists it, and
never looks at it again, so appends to a segment it has seen never arrive.

Offsets (what Spark checkpoints, one JSON object per micro-batch):

- ``segments``: for each segment being read, by name: ``c`` its creation
  time (Unix ms; a segment deleted and created again under the same name is
  another segment), ``from`` and ``at``: this batch reads ``[from, at)``.
  Both are event boundaries: the end of the last complete event the mount
  shows (`user.segment.event_end`: the length, or just past the last
  newline of an active ``lines`` segment), or, for a segment whose codec
  the gateway does not know read as lines, the last newline found by
  reading; where reading starts, the first event at or after the start
  offset (the mount's ``.trimmed`` view's ``view_offset``);
- ``done``: the sealed segments read to their end (name: creation time).
  They leave ``segments``; ``done`` keeps their names so that they are not
  read again, until they are deleted (retention), when they leave it too.

So a micro-batch never holds part of an event, a rolled stream's successor
is picked up when it appears in the directory, and a replayed batch (after
a restart from the checkpoint) reads the same bytes. A segment truncated
past the position reached goes on from its first event at or after the new
start offset (what was below is skipped, with a warning in the driver's
log); a deleted one is dropped (what was not read of it is lost with it;
a task whose file is deleted while it reads returns what it read).

Options (besides those of the batch source: ``codec``, ``includeActive``,
``splitSize``):

- ``codec``: ``framed`` or ``lines``; by default each segment's own codec
  (``user.segment.codec``), else ``framed``;
- ``startingOffsets``: ``earliest`` (default: everything there is) or
  ``latest`` (only what is appended after the query starts; segments that
  appear later are read from their start);
- ``minPartitions``: cut each batch into at least this many parts (of at
  least 4 MiB) so every core works on it; default: the driver's cores;
- ``maxBytesPerTrigger`` / ``maxEventsPerTrigger``: admission control,
  oldest segments (by name) first. A bytes limit cuts at indexed event
  boundaries (``.NAME.events``) or newlines; an events limit counts events
  by reading them on the driver. At least one event is admitted per batch.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from gateway.container.names import TRIMMED_DIR
from pipeline.parts import (
    DEFAULT_SPLIT,
    SCAN_BYTES,
    LinesPart,
    SegmentPart,
    framed_events,
    line_events,
    list_segment_files,
    mount_root,
    parse_bool,
    parse_size,
    read_event_index,
    split,
)

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_XATTR = "user.segment."
#: The smallest part a batch is cut into for parallelism (`minPartitions`).
MIN_PART = 4 * 1024 * 1024
#: How long a task waits for its node's mount to show what the driver saw.
MOUNT_CATCH_UP = 60.0
#: Bytes read at a time when the driver counts or looks for events.
_READ = 4 * 1024 * 1024


@dataclass(slots=True)
class Listed:
    """One segment as the driver saw it: name, creation, where it can be read."""

    name: str
    file: str
    created: int
    sealed: bool
    start_offset: int
    #: The end of its last complete event (for the codec it is read with).
    end: int
    codec: str


def _xattr(file: str, key: str) -> str:
    return os.getxattr(file, _XATTR + key).decode()


def _last_newline_end(file: str, lo: int, hi: int) -> int:
    """Just past the last newline in ``[lo, hi)`` of ``file``, or ``lo`` if there is none."""
    with open(file, "rb", buffering=0) as f:
        pos = hi
        step = SCAN_BYTES
        while pos > lo:
            a = max(lo, pos - step)
            f.seek(a)
            block = f.read(pos - a)
            k = block.rfind(b"\n")
            if k >= 0:
                return a + k + 1
            pos = a
            step = min(2 * step, _READ)
    return lo


def _walk_frames(f: BinaryIO, pos: int, hi: int, events: int) -> tuple[int, int]:
    """(where frames read from ``pos`` in ``f`` end, how many): up to ``events`` of them,
    all ending at or before ``hi``.
    """
    n = 0
    f.seek(pos)
    while n < events:
        head = f.read(4)
        if len(head) < 4:
            break
        end = pos + 4 + _LENGTH.unpack(head)[0]
        if end > hi:
            break
        f.seek(end)
        pos = end
        n += 1
    return pos, n


def _first_event(file: str) -> int:
    """The first event at or after a segment's start offset: its trimmed view's start."""
    root = mount_root(file)
    trimmed = os.path.join(root, TRIMMED_DIR, os.path.relpath(file, root))
    return int(_xattr(trimmed, "view_offset"))


def _count_cut(file: str, codec: str, lo: int, hi: int, events: int) -> tuple[int, int]:
    """(where the ``events``-th event from ``lo`` ends, or ``hi``; events up to there)."""
    n = 0
    with open(file, "rb", buffering=_READ) as f:
        f.seek(lo)
        pos = lo
        if codec == "lines":
            while pos < hi:
                block = f.read(min(_READ, hi - pos))
                if not block:
                    break
                k = -1
                while n < events:
                    k = block.find(b"\n", k + 1)
                    if k < 0:
                        break
                    n += 1
                if n == events and k >= 0:
                    return pos + k + 1, n
                pos += len(block)
            return min(pos, hi), n
    # The last frame may end past ``hi``: an event at least, whatever the limit.
    with open(file, "rb", buffering=_READ) as f:
        pos, n = _walk_frames(f, lo, hi, events)
        if n < events and pos < hi:
            pos, last = _walk_frames(f, pos, 1 << 62, 1)
            n += last
        return min(pos, hi), n


def _bytes_cut(file: str, codec: str, lo: int, hi: int, budget: int) -> int:
    """The furthest event boundary in ``(lo, lo + budget]``, else the first past it."""
    cap = lo + budget
    if cap >= hi:
        return hi
    if codec == "lines":
        cut = _last_newline_end(file, lo, cap)
        if cut > lo:
            return cut
        return _count_cut(file, codec, lo, hi, 1)[0]
    # From the last indexed boundary below the cap (about a MiB apart),
    # walk the frames up to it.
    pos = max([lo, *(b for b in read_event_index(file) if lo < b <= cap)])
    with open(file, "rb", buffering=_READ) as f:
        pos = _walk_frames(f, pos, cap, 1 << 62)[0]
    return pos if pos > lo else _count_cut(file, codec, lo, hi, 1)[0]


class SegmentsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the events appended to the segments under a path.

    ``trigger(availableNow=True)`` reads what is there when the query
    starts (in batches of the per-trigger limit) and stops.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        o = {k.lower(): v for k, v in options.items()}
        self.path = o.get("path", "")
        if not self.path:
            raise ValueError(
                'segments: give a path: spark.readStream.format("segments").load(PATH)'
            )
        self.codec = o.get("codec", "")
        if self.codec not in ("", "framed", "lines"):
            raise ValueError(f"segments: codec must be framed or lines, not {self.codec!r}")
        starting = o.get("startingoffsets", "earliest")
        if starting not in ("earliest", "latest"):
            raise ValueError(
                f"segments: startingOffsets must be earliest or latest, not {starting!r}"
            )
        self.latest_start = starting == "latest"
        self.include_active = parse_bool(o.get("includeactive", "true"))
        self.split_size = max(1, parse_size(o.get("splitsize", str(DEFAULT_SPLIT))))
        self.min_partitions = max(1, int(o.get("minpartitions", os.cpu_count() or 2)))
        self.max_bytes = parse_size(o["maxbytespertrigger"]) if "maxbytespertrigger" in o else 0
        self.max_events = int(o["maxeventspertrigger"]) if "maxeventspertrigger" in o else 0
        if self.max_bytes and self.max_events:
            raise ValueError("segments: give maxBytesPerTrigger or maxEventsPerTrigger, not both")
        if self.max_bytes < 0 or self.max_events < 0:
            raise ValueError("segments: a per-trigger limit must be positive")
        self.root = mount_root(self.path)
        #: Trigger.AvailableNow: the segments and ends there were at the start.
        self._target: dict[str, tuple[int, int]] | None = None

    # -- listing -------------------------------------------------------------------------

    def _codec_of(self, declared: str) -> str:
        return self.codec or (declared if declared in ("lines", "framed") else "framed")

    def list(self, done: dict[str, int] | None = None) -> list[Listed]:
        """Every segment under the path now, in name order (a stream's oldest first).

        Segments in ``done`` (name: creation time) are only checked for
        being the same segment: their other attributes are not read.
        """
        found = []
        done = done or {}
        for file in list_segment_files(self.path):
            name = os.path.relpath(file, self.root)
            try:
                if name in done:
                    created = int(_xattr(file, "created_ms"))
                    if created == done[name]:
                        found.append(Listed(name, file, created, True, 0, 0, ""))
                        continue
                # Sealed before the end: a segment seen sealed has its final end.
                sealed = _xattr(file, "sealed") == "1"
                if not sealed and not self.include_active:
                    continue
                declared = _xattr(file, "codec")
                end = int(_xattr(file, "event_end"))
                created = int(_xattr(file, "created_ms"))
                start_offset = int(_xattr(file, "start_offset"))
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ESTALE):
                    continue  # deleted since the listing
                raise
            codec = self._codec_of(declared)
            if codec == "lines" and declared != "lines" and not sealed:
                # The gateway does not know where this segment's lines end.
                end = _last_newline_end(file, start_offset, end)
            found.append(Listed(name, file, created, sealed, start_offset, end, codec))
        return found

    def _first(self, seg: Listed) -> int:
        """Where reading a segment starts: its first event at or after the start offset."""
        if seg.start_offset == 0:
            return 0
        try:
            return _first_event(seg.file)
        except OSError:
            return seg.end

    # -- offsets -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """Earliest: nothing read yet; latest: every segment there is, read to its end."""
        if not self.latest_start:
            return {"segments": {}, "done": {}}
        segments: dict[str, Any] = {}
        done: dict[str, int] = {}
        for seg in self.list():
            if seg.sealed:
                done[seg.name] = seg.created
            else:
                segments[seg.name] = {
                    "c": seg.created,
                    "from": seg.end,
                    "at": seg.end,
                    "k": seg.codec,
                }
        return {"segments": segments, "done": done}

    def prepareForTriggerAvailableNow(self) -> None:
        """Note what there is now: no batch goes past it."""
        self._target = {seg.name: (seg.created, seg.end) for seg in self.list()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxBytesPerTrigger`` / ``maxEventsPerTrigger``, else everything."""
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        if self.max_events:
            return ReadMaxRows(self.max_events)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next batch's end: every segment advanced to its last event (within the limit)."""
        was = start.get("segments", {})
        done_before = start.get("done", {})
        listed = self.list(done_before)
        if self._target is not None:
            target = self._target
            listed = [s for s in listed if target.get(s.name, (0, 0))[0] == s.created]
            for s in listed:
                s.end = min(s.end, target[s.name][1]) if s.end else s.end
        seen = {seg.name for seg in listed}
        done = {n: c for n, c in done_before.items() if n in seen}
        segments: dict[str, Any] = {}
        budget = (
            limit.max_bytes
            if isinstance(limit, ReadMaxBytes)
            else limit.max_rows
            if isinstance(limit, ReadMaxRows)
            else None
        )
        moved = len(done) != len(done_before)
        for gone in set(was) - seen:
            log.warning("segments: %s was deleted; what was not read of it is lost", gone)
            moved = True
        for seg in listed:
            if done.get(seg.name) == seg.created:
                continue
            before = was.get(seg.name)
            if before is not None and before["c"] == seg.created:
                pos = before["at"]
            else:
                if before is not None:
                    log.warning("segments: %s was deleted and created again", seg.name)
                pos = self._first(seg)
                moved = True
            if pos < seg.start_offset:
                first = self._first(seg)
                log.warning(
                    "segments: %s was truncated at %d; %d byte(s) not read are skipped",
                    seg.name,
                    seg.start_offset,
                    first - pos,
                )
                pos = first
                moved = True
            end = max(pos, seg.end)
            if budget is not None and end > pos:
                if budget <= 0:
                    end = pos
                elif isinstance(limit, ReadMaxBytes):
                    end = _bytes_cut(seg.file, seg.codec, pos, end, budget)
                    budget -= end - pos
                else:
                    end, n = _count_cut(seg.file, seg.codec, pos, end, budget)
                    budget -= n
            if end > pos:
                moved = True
            entry = {"c": seg.created, "from": pos, "at": end, "k": seg.codec}
            if seg.sealed:
                entry["sealed"] = True
                if end >= seg.end:
                    # Read to its final end with this batch: finished.
                    # Listed once more, with the range that finishes it.
                    done[seg.name] = seg.created
            segments[seg.name] = entry
        if not moved:
            return start
        return {"segments": segments, "done": done}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Not reported (it would cost a listing per trigger)."""
        return None

    # -- batches -------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The parts of every segment's ``[from, at)`` in ``end``."""
        parts: list[InputPartition] = []
        ranges = end.get("segments", {})
        total = sum(max(0, r["at"] - r["from"]) for r in ranges.values())
        # A batch is often one segment's new bytes: cut it so that every
        # core has a part (parts of at least MIN_PART, at most splitSize).
        size = min(self.split_size, max(MIN_PART, -(-total // self.min_partitions)))
        for name, r in ranges.items():
            lo, hi = r["from"], r["at"]
            if hi <= lo:
                continue
            file = os.path.join(self.root, name)
            sealed = bool(r.get("sealed"))
            if r["k"] == "lines":
                for a in range(lo, hi, size):
                    b = min(a + size, hi)
                    parts.append(LinesPart(file, name, a, b, hi, a == lo, sealed, True))
            else:
                index = [lo, *(x for x in read_event_index(file) if lo < x < hi)]
                if hi - lo <= size:
                    index = [lo]
                for a, b in split(index, lo, hi, size):
                    parts.append(SegmentPart(file, name, a, b, a, b, sealed))
        for p in parts:
            # A growing file's size as the kernel caches it may be older
            # than the end the driver read from the xattr.
            p.direct = not p.sealed  # type: ignore[attr-defined]
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The events of one part, as Arrow record batches."""
        return _read_part(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the segments are the gateway's."""


def _wait_for_end(p: LinesPart | SegmentPart, end: int) -> None:
    """Wait until this node's mount shows the segment up to ``end``.

    The driver planned the batch from its own node's mount; on another node
    the same segment (another node's, or this one's tail) may show less for
    a moment, until that node's view of it refreshes.
    """
    deadline = time.monotonic() + MOUNT_CATCH_UP
    while (shown := int(_xattr(p.file, "event_end"))) < end:
        if time.monotonic() > deadline:
            raise OSError(
                f"{p.segment}: this node's mount shows {shown} bytes after "
                f"{MOUNT_CATCH_UP:.0f} s; the batch reads up to {end}"
            )
        time.sleep(0.05)


def _read_part(p: InputPartition) -> Iterator[Any]:
    """A part's events; nothing when its segment was deleted or truncated past it."""
    if not isinstance(p, LinesPart | SegmentPart):
        return
    try:
        _wait_for_end(p, p.length if isinstance(p, LinesPart) else p.end)
        start_offset = int(_xattr(p.file, "start_offset"))
        if start_offset > p.start:
            # Truncated since the batch was planned: the bytes below read as
            # zeros. Start at the first event at or after the start offset.
            first = _first_event(p.file)
            if first >= p.end:
                return
            p.start = first
            if isinstance(p, SegmentPart):
                p.lo = max(p.lo, first)
            else:
                p.head = True
        yield from line_events(p) if isinstance(p, LinesPart) else framed_events(p)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESTALE):  # deleted (ESTALE: while open)
            return
        raise
