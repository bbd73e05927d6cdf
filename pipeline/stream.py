"""The streaming ``segments`` source: Structured Streaming over growing segments.

``spark.readStream.format("segments").option("path", MOUNT + "/clicks").load()``
gives the rows of the batch source (`pipeline.source`: ``segment``,
``offset``, ``event``, ``sealed``) as they are appended. Spark's own file
source cannot do this: it reads a file once, when it first lists it, and
never looks at it again, so appends to a segment it has seen never arrive.

Offsets (what Spark checkpoints, one JSON object per micro-batch):

- ``segments``: for each segment being read, by name: ``c`` its creation
  time (Unix ms; a segment deleted and created again under the same name is
  another segment), ``n`` the node that owns it, ``from`` and ``at``: this
  batch reads ``[from, at)``.
  Both are event boundaries: the end of the last complete event the mount
  shows (`user.segment.event_end`: the length, or just past the last
  newline of an active ``lines`` segment), or, for a segment whose codec
  the gateway does not know read as lines, the last newline found by
  reading; where reading starts, the first event at or after the start
  offset (the mount's ``.trimmed`` view's ``view_offset``);
- ``done``: the sealed segments read to their end (name: [creation time,
  node]; older offsets have the creation time alone). They leave
  ``segments``; ``done`` keeps their names so that they are not read
  again, until they are deleted (retention), when they leave it too.

So a micro-batch never holds part of an event, a rolled stream's successor
is picked up when it appears in the directory, and a replayed batch (after
a restart from the checkpoint) reads the same bytes. A segment truncated
past the position reached goes on from its first event at or after the new
start offset (what was below is skipped, with a warning in the driver's
log); a deleted one is dropped (what was not read of it is lost with it;
a task whose file is deleted while it reads returns what it read).

Deleted means proven deleted (`_gone`), never "not shown": a gateway that
restarts leaves a mount answering ENOTCONN, then a plain empty directory,
and another node's segments appear in a restarted mount some time after
its own. Offsets are planned from a live gateway mount only (the driver
waits up to ``mountTimeout`` for one, then the batch fails); a segment that
is not shown leaves the offset only if its name now holds another segment
or its directory shows a later segment of the same node (a stream's
retention deletes the oldest first). Otherwise it is kept where it was,
unread, with a warning, and read on when it shows again. A task that does
not find its file, or cannot read it, tries again for a while before it
hands over rows, then fails (Spark runs it again, or the batch fails);
it ends early only for a segment the mount shows deleted by the same rule.
So a segment deleted with no later one of its node beside it (a lone
segment, a whole stream) while a planned batch reads it fails that batch
until it shows again: unproven, a deletion is not assumed.

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
  by reading them on the driver. At least one event is admitted per batch;
- ``mountTimeout``: how long the driver waits for a mount it cannot read
  (a gateway restarting) before the batch fails; default 120 s.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from gateway.config import parse_duration
from gateway.container.segment_names import TRIMMED_DIR
from pipeline.parts import (
    DEFAULT_SPLIT,
    SCAN_BYTES,
    LinesPart,
    MountUnavailable,
    Part,
    SegmentPart,
    check_mount,
    framed_events,
    gateway_mount,
    line_events,
    list_segment_files,
    parse_bool,
    parse_size,
    read_event_index,
    split,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_LENGTH = struct.Struct(">I")
_XATTR = "user.segment."
#: The smallest part a batch is cut into for parallelism (`minPartitions`).
MIN_PART = 4 * 1024 * 1024
#: How long a task waits for its node's mount to show what the driver saw.
MOUNT_CATCH_UP = 60.0
#: Bytes read at a time when the driver counts or looks for events.
_READ = 4 * 1024 * 1024
#: How long the driver waits for a mount that cannot be read (option
#: ``mountTimeout``) before the batch fails.
MOUNT_TIMEOUT = 120.0
#: How often a mount that cannot be read is tried again.
_RETRY = 0.5
#: Errors that no wait cures: raised at once.
_PERMANENT = (errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.ENOTDIR)


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
    #: The node that owns it (``user.segment.node``; "" if not known).
    node: str = ""


#: A listing (the reader's ``list`` method hides the builtin in its class).
Segments = list[Listed]


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


def _first_event(root: str, name: str) -> int:
    """The first event at or after a segment's start offset: its trimmed view's start."""
    return int(_xattr(os.path.join(root, TRIMMED_DIR, name), "view_offset"))


def _done(value: Any) -> tuple[int, str]:
    """A ``done`` entry: (creation time, node); a bare creation time in older offsets."""
    if isinstance(value, int):
        return value, ""
    return int(value[0]), str(value[1])


def _gone(
    name: str, created: int, node: str, listing: Mapping[str, Listed], by_dir: Mapping[str, Any]
) -> bool:
    """Whether the listing proves that segment ``name`` (``created``, ``node``) is deleted.

    Positive evidence only: its name now holds another segment (created
    again), or its directory shows a segment of the same node created after
    it (retention deletes a stream's oldest segments; the gateway shows a
    node's segments all at once, so one that is there while an older one is
    not means the older one was deleted). A mount that lists nothing (down,
    restarting, a plain directory where it was) or not yet another node's
    segments proves nothing: such a segment is kept.
    """
    now = listing.get(name)
    if now is not None:
        return now.created != created
    return any(
        s.created > created and (not node or not s.node or s.node == node)
        for s in by_dir.get(os.path.dirname(name), ())
    )


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
        self.mount_timeout = (
            parse_duration(o["mounttimeout"]) if "mounttimeout" in o else MOUNT_TIMEOUT
        )
        #: The gateway mount holding the path (names are relative to it);
        #: found when first needed if it is not in the mount table yet.
        self._root = gateway_mount(self.path)
        #: Trigger.AvailableNow: the segments and ends there were at the start.
        self._target: dict[str, tuple[int, int]] | None = None
        #: Segments kept although the mount does not show them (warned once).
        self._missing: set[tuple[str, int]] = set()

    @property
    def root(self) -> str:
        """The mount point of the gateway mount that holds the path."""
        if self._root is None:
            self._root = self._retrying("find the mount", self._find_root)
        return self._root

    def _find_root(self) -> str:
        root = gateway_mount(self.path)
        if root is None:
            raise MountUnavailable(errno.ENOTCONN, f"no segment-gateway mount holds {self.path}")
        return root

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, again while it fails with an OSError, for up to ``mountTimeout``.

        A gateway that restarts takes its mount away for seconds: what was
        read through it meanwhile (nothing, or errors) is never planned
        from. After the timeout the error is raised and the batch fails;
        nothing was taken for deleted, so the query, started again from its
        checkpoint, goes on where it was.
        """
        deadline = time.monotonic() + self.mount_timeout
        warned = False
        while True:
            try:
                return attempt()
            except OSError as e:
                if e.errno in _PERMANENT or time.monotonic() >= deadline:
                    raise MountUnavailable(
                        e.errno or errno.EIO,
                        f"segments: cannot {what} under {self.path}"
                        f" (waited {self.mount_timeout:g} s): {e}; nothing was taken for"
                        " deleted, so the query started again goes on where it was",
                    ) from e
                if not warned:
                    log.warning("segments: cannot %s under %s: %s; waiting up to %g s for "
                                "the mount", what, self.path, e, self.mount_timeout)  # fmt: skip
                    warned = True
                time.sleep(_RETRY)

    # -- listing -------------------------------------------------------------------------

    def _codec_of(self, declared: str) -> str:
        return self.codec or (declared if declared in ("lines", "framed") else "framed")

    def list(self, done: Mapping[str, tuple[int, str]] | None = None) -> list[Listed]:
        """Every segment under the path now, in name order (a stream's oldest first).

        Segments in ``done`` (name: creation time, node) are only checked
        for being the same segment: their other attributes are not read.
        Active segments are listed even without ``includeActive`` (they are
        evidence of what was deleted); the callers skip them.

        Only a live gateway mount is listed, the same one from start to end
        (`MountUnavailable` otherwise): a dead mount answers ENOTCONN and a
        restarting one is an empty directory for a moment.
        """
        found = []
        done = done or {}
        mount = check_mount(self.root)
        for file in list_segment_files(self.path):
            name = os.path.relpath(file, self.root)
            try:
                if name in done:
                    created = int(_xattr(file, "created_ms"))
                    if created == done[name][0]:
                        found.append(Listed(name, file, created, True, 0, 0, "", done[name][1]))
                        continue
                # Sealed before the end: a segment seen sealed has its final end.
                sealed = _xattr(file, "sealed") == "1"
                declared = _xattr(file, "codec")
                end = int(_xattr(file, "event_end"))
                created = int(_xattr(file, "created_ms"))
                start_offset = int(_xattr(file, "start_offset"))
                node = _xattr(file, "node")
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ESTALE):
                    continue  # deleted since the listing
                raise
            codec = self._codec_of(declared)
            if codec == "lines" and declared != "lines" and not sealed and self.include_active:
                # The gateway does not know where this segment's lines end.
                end = _last_newline_end(file, start_offset, end)
            found.append(Listed(name, file, created, sealed, start_offset, end, codec, node))
        if check_mount(self.root) != mount:
            raise MountUnavailable(errno.ENOTCONN, f"the mount at {self.root} changed")
        return found

    def _listing(self, done: Mapping[str, tuple[int, str]] | None = None) -> Segments:
        """`list`, waiting (up to ``mountTimeout``) while the mount cannot be read."""
        return self._retrying("list the segments", lambda: self.list(done))

    def _readable(self, listed: Segments) -> Segments:
        """The listed segments this query reads (active ones only with ``includeActive``)."""
        return listed if self.include_active else [s for s in listed if s.sealed]

    def _first(self, seg: Listed) -> int:
        """Where reading a segment starts: its first event at or after the start offset."""
        if seg.start_offset == 0:
            return 0
        return _first_event(self.root, seg.name)

    # -- offsets -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """Earliest: nothing read yet; latest: every segment there is, read to its end."""
        if not self.latest_start:
            return {"segments": {}, "done": {}}
        segments: dict[str, Any] = {}
        done: dict[str, Any] = {}
        for seg in self._readable(self._listing()):
            if seg.sealed:
                done[seg.name] = [seg.created, seg.node]
            else:
                segments[seg.name] = {
                    "c": seg.created,
                    "from": seg.end,
                    "at": seg.end,
                    "k": seg.codec,
                    "n": seg.node,
                }
        return {"segments": segments, "done": done}

    def prepareForTriggerAvailableNow(self) -> None:
        """Note what there is now: no batch goes past it."""
        listed = self._readable(self._listing())
        self._target = {seg.name: (seg.created, seg.end) for seg in listed}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxBytesPerTrigger`` / ``maxEventsPerTrigger``, else everything."""
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        if self.max_events:
            return ReadMaxRows(self.max_events)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next batch's end: every segment advanced to its last event (within the limit).

        Planned from a live mount only (waiting up to ``mountTimeout`` while
        there is none); a segment the mount no longer shows leaves the
        offset only when its deletion is proven (`_gone`).
        """
        return self._retrying("plan the next batch", lambda: self._latest(start, limit))

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        was = start.get("segments", {})
        done_before = {n: _done(v) for n, v in start.get("done", {}).items()}
        everything = self.list(done_before)
        listing = {seg.name: seg for seg in everything}
        by_dir: dict[str, Segments] = {}
        for seg in everything:
            by_dir.setdefault(os.path.dirname(seg.name), []).append(seg)
        listed = self._readable(everything)
        if self._target is not None:
            target = self._target
            listed = [s for s in listed if target.get(s.name, (0, 0))[0] == s.created]
            for s in listed:
                s.end = min(s.end, target[s.name][1]) if s.end else s.end
        segments: dict[str, Any] = {}
        done: dict[str, Any] = {}
        budget = (
            limit.max_bytes
            if isinstance(limit, ReadMaxBytes)
            else limit.max_rows
            if isinstance(limit, ReadMaxRows)
            else None
        )
        moved = False
        for name, (created, node) in done_before.items():
            shown = listing.get(name)
            if shown is not None and shown.created == created:
                done[name] = [created, node or shown.node]
            elif _gone(name, created, node, listing, by_dir):
                moved = True  # deleted (and perhaps created again: read below as new)
            else:
                done[name] = [created, node]
                self._keep(name, created)
        for name, before in was.items():
            shown = listing.get(name)
            if name in done or shown is not None:
                continue  # read on below (or, created again, from its start)
            if _gone(name, before["c"], before.get("n", ""), listing, by_dir):
                log.warning("segments: %s was deleted; what was not read of it is lost", name)
                moved = True
            else:
                # Not shown, not proven deleted: kept where it was, nothing read.
                segments[name] = {**before, "from": before["at"]}
                self._keep(name, before["c"])
        for seg in listed:
            finished = done.get(seg.name)
            if finished is not None and finished[0] == seg.created:
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
            entry = {"c": seg.created, "from": pos, "at": end, "k": seg.codec, "n": seg.node}
            if seg.sealed:
                entry["sealed"] = True
                if end >= seg.end:
                    # Read to its final end with this batch: finished.
                    # Listed once more, with the range that finishes it.
                    done[seg.name] = [seg.created, seg.node]
            segments[seg.name] = entry
        if not moved:
            return start
        return {"segments": segments, "done": done}

    def _keep(self, name: str, created: int) -> None:
        """Say once that a segment the mount does not show is kept, not taken for deleted."""
        if (name, created) not in self._missing:
            self._missing.add((name, created))
            log.warning(
                "segments: %s is not shown by the mount, and nothing shows it was deleted "
                "(a gateway restarting, another node's segments not listed yet): kept, "
                "to be read on from where it was when it shows again",
                name,
            )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Not reported (it would cost a listing per trigger)."""
        return None

    # -- batches -------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The parts of every segment's ``[from, at)`` in ``end``."""
        parts: builtins.list[Part] = []
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
            planned: builtins.list[Part] = []
            if r["k"] == "lines":
                for a in range(lo, hi, size):
                    b = min(a + size, hi)
                    planned.append(LinesPart(file, name, a, b, hi, a == lo, sealed, True))
            else:
                index = [lo]
                if hi - lo > size:
                    # The index only cuts the range into parts: one part without it.
                    with contextlib.suppress(OSError):
                        index += [x for x in read_event_index(file) if lo < x < hi]
                for a, b in split(index, lo, hi, size):
                    planned.append(SegmentPart(file, name, a, b, a, b, sealed))
            for part in planned:
                part.created = r["c"]
                part.node = r.get("n", "")
            parts += planned
        for p in parts:
            # A growing file's size as the kernel caches it may be older
            # than the end the driver read from the xattr.
            p.direct = not p.sealed
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


def _part_root(p: Part) -> str:
    """The mount point a part's file is under (its name is the path below it)."""
    return p.file[: len(p.file) - len(p.segment)].rstrip("/") or "/"


def _deleted(p: Part) -> bool:
    """Whether the mount proves a part's segment deleted (see `_gone`).

    Asked only when the file is not found (or stale): a live gateway mount
    shows its name holding another segment, or a segment of the same node
    created after it in its directory. A part whose segment's creation is
    not known has no proof.
    """
    if not p.created:
        return False
    try:
        check_mount(_part_root(p))
        try:
            return int(_xattr(p.file, "created_ms")) != p.created
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ESTALE):
                return False
        directory = os.path.dirname(p.file)
        for entry in sorted(os.listdir(directory), reverse=True):  # a stream's newest first
            if entry.startswith((".", "_")):
                continue
            file = os.path.join(directory, entry)
            try:
                if int(_xattr(file, "created_ms")) > p.created and (
                    not p.node or _xattr(file, "node") == p.node
                ):
                    return True
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ESTALE, errno.ENODATA):
                    return False  # a directory, or a mount going away
    except OSError:
        return False
    return False


def _read_part(p: InputPartition) -> Iterator[Any]:
    """A part's events; nothing more once its segment is proven deleted.

    Until its first rows are handed over, a part whose mount cannot be read
    (a gateway restarting, this node's view not showing the segment yet) is
    tried again for up to `MOUNT_CATCH_UP`. Any error after that, or one
    that lasts, fails the task: Spark runs it again, or the batch fails and
    the query started again from its checkpoint reads it again. A task never
    ends early as if the data ended there, but for a segment the mount shows
    deleted (retention while the query lags behind): what was read of it is
    returned.
    """
    if not isinstance(p, LinesPart | SegmentPart):
        return
    deadline = time.monotonic() + MOUNT_CATCH_UP
    handed = waited = False
    while True:
        try:
            for batch in _read_part_once(p):
                handed = True
                yield batch
            return
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ESTALE) and _deleted(p):
                log.warning("segments: %s was deleted while a task read it; what was not "
                            "read of it is lost", p.segment)  # fmt: skip
                return
            if handed or e.errno in _PERMANENT or time.monotonic() > deadline:
                problem = (
                    f"{p.segment} [{p.start}, {p.end}): {e}; the mount does not show it "
                    "deleted, so the task fails (to be run again)"
                )
                raise (OSError(e.errno, problem) if e.errno else OSError(problem)) from e
            if not waited:
                log.warning("segments: a task cannot read %s yet: %s; trying again for up "
                            "to %g s", p.segment, e, MOUNT_CATCH_UP)  # fmt: skip
                waited = True
            time.sleep(_RETRY)


def _read_part_once(p: LinesPart | SegmentPart) -> Iterator[Any]:
    """A part's events, read once; starting at the first event left if it was truncated."""
    if p.created and int(_xattr(p.file, "created_ms")) != p.created:
        # Deleted and created again: its bytes are another segment's.
        raise OSError(errno.ESTALE, f"{p.segment} was created again", p.file)
    _wait_for_end(p, p.length if isinstance(p, LinesPart) else p.end)
    start_offset = int(_xattr(p.file, "start_offset"))
    if start_offset > p.start:
        # Truncated since the batch was planned: the bytes below read as
        # zeros. Start at the first event at or after the start offset.
        first = _first_event(_part_root(p), p.segment)
        if first >= p.end:
            return
        p.start = first
        if isinstance(p, SegmentPart):
            p.lo = max(p.lo, first)
        else:
            p.head = True
    yield from line_events(p) if isinstance(p, LinesPart) else framed_events(p)
