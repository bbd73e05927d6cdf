"""Reading the journal back: frame iteration, torn-tail detection, replay.

The rules (docs/FORMATS.md, "Recovery"):

* Frames are read in order from the oldest file. Sequence numbers must run
  on without a gap, within and across files, and epochs must not go down.
* Where a file stops holding valid frames, either the file simply ends
  (end of file, or zeros: the preallocated space) or there is a bad frame.
* A bad frame is a *torn write* if nothing valid that was written later
  exists: no later file holds a frame, and the only valid frames after it in
  its file belong to the same write group (one fdatasync) as the bad frame
  itself. Such a group was never acknowledged; it is cut off.
* Anything else is *corruption*: a frame that was acknowledged is unreadable.
  The journal refuses to open, naming the file and offset.

Why the group rule is exact: a group is written with one pwritev and acked
after one fdatasync, and the next group is written only after that, so a
crash can tear only the last group, in any order of its pages. The bad
frame's group is either that of the frame before it, or (if it begins a new
group) the group numbered by its own first sequence number, which is one
past the frame before it. A group never spans files.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import os
import pathlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.errors import JournalCorrupt
from gateway.journal.files import JournalFileName, fsync_directory, list_files
from gateway.journal.format import (
    HEADER_SIZE,
    MAGIC,
    FrameError,
    FrameHeader,
    decode_header,
    frame_crc_ok,
    operation_ends,
)
from gateway.protocol.journal_pb2 import Frame, Operation

log = logging.getLogger(__name__)

ZERO_END = "zero-filled header (end of written data)"

#: Called once per recovered operation, in sequence order, with its sequence number.
ReplayCallback = Callable[[int, Operation], None]
#: ``on_data(path, at)``: the next append replayed has its data in ``path`` at ``at``.
DataCallback = Callable[[pathlib.Path, int], None]


@dataclass(frozen=True, slots=True)
class FrameRecord:
    """A valid frame read from a file."""

    path: pathlib.Path
    offset: int
    header: FrameHeader
    payload: bytes

    @property
    def end_offset(self) -> int:
        """File offset just past this frame."""
        return self.offset + self.header.frame_length

    def operations(self) -> list[Operation]:
        """Decode the payload; raise JournalCorrupt if it disagrees with the header."""
        try:
            frame = Frame.FromString(self.payload)
        except Exception as e:  # protobuf raises DecodeError; be broad, it is corruption
            raise JournalCorrupt(
                str(self.path), self.offset, f"payload does not decode: {e}"
            ) from e
        if len(frame.operations) != self.header.operation_count:
            raise JournalCorrupt(
                str(self.path),
                self.offset,
                f"header says {self.header.operation_count} operations, "
                f"payload holds {len(frame.operations)}",
            )
        return list(frame.operations)


@dataclass(frozen=True, slots=True)
class FileEnd:
    """Where a file stops holding valid frames, and why."""

    path: pathlib.Path
    offset: int
    #: None: the file ends exactly here. ZERO_END: zeros (preallocated space).
    #: Anything else: a bad frame, described.
    reason: str | None

    @property
    def is_clean(self) -> bool:
        """End of file or zeros: nothing was being written here."""
        return self.reason is None or self.reason == ZERO_END


@contextmanager
def mapped(path: pathlib.Path) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, memory-mapped (empty files give b"")."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            yield m


def _frame_at(data: bytes | mmap.mmap, offset: int, path: pathlib.Path) -> FrameRecord:
    """The valid frame at ``offset``; raise FrameError saying why there is none."""
    header = decode_header(data[offset : offset + HEADER_SIZE])
    end = offset + header.frame_length
    if end > len(data):
        raise FrameError(
            f"frame of {header.frame_length} bytes runs past the end of the file "
            f"({len(data) - offset} bytes left)"
        )
    payload = data[offset + HEADER_SIZE : end]
    if not frame_crc_ok(data[offset : offset + HEADER_SIZE], payload):
        raise FrameError("CRC32C mismatch")
    return FrameRecord(path, offset, header, payload)


def read_frames(data: bytes | mmap.mmap, path: pathlib.Path) -> Iterator[FrameRecord | FileEnd]:
    """Yield the valid frames from the start of ``data``, then one FileEnd."""
    offset = 0
    while offset < len(data):
        try:
            record = _frame_at(data, offset, path)
        except FrameError as e:
            yield FileEnd(path, offset, str(e))
            return
        yield record
        offset = record.end_offset
    yield FileEnd(path, offset, None)


def valid_frames_after(
    data: bytes | mmap.mmap, start: int, path: pathlib.Path
) -> Iterator[FrameRecord]:
    """Every valid frame whose header begins at or after ``start`` (found by magic)."""
    pos = data.find(MAGIC, start)
    while pos >= 0:
        try:
            record = _frame_at(data, pos, path)
        except FrameError:
            pos = data.find(MAGIC, pos + 1)
            continue
        yield record
        pos = data.find(MAGIC, record.end_offset)


@dataclass
class ReplayResult:
    """What recovery found (and, when repairing, left behind)."""

    #: Files that hold frames, oldest first, after any repair.
    files: list[JournalFileName] = field(default_factory=list)
    #: The sequence number the next operation gets.
    next_sequence: int = 1
    #: Highest epoch in any frame (0 for an empty journal).
    max_epoch: int = 0
    frames: int = 0
    operations: int = 0
    #: Sequence numbers of the checkpoint operations found.
    checkpoints: list[int] = field(default_factory=list)
    #: The torn write that was (or, without repair, would be) cut off.
    torn: FileEnd | None = None
    #: Files without frames that were (or would be) deleted.
    empty_files: list[pathlib.Path] = field(default_factory=list)
    #: Bytes of data in the files that hold frames.
    data_bytes: int = 0


def replay_journal(
    directory: pathlib.Path,
    replay: ReplayCallback | None = None,
    repair: bool = False,
    on_file: Callable[[int], None] | None = None,
    on_data: DataCallback | None = None,
) -> ReplayResult:
    """Read the whole journal in ``directory``, calling ``replay`` for each operation.

    ``on_file(first_seq)`` is called before the operations of each file that
    holds frames (an owner that tracks which file holds what needs it).
    ``on_data(path, at)`` is called just before ``replay`` of an append whose
    data lies in file ``path`` at ``at`` (checked byte for byte), so that its
    owner can read it from there rather than keep a copy.

    With ``repair`` (the writer's open, under the directory lock) a torn tail
    is cut off and files without frames are deleted, durably. Without it the
    journal is only read. Raises JournalCorrupt on corruption, before any
    change is made.
    """
    result = ReplayResult()
    files = list_files(directory)
    expected: int | None = None  # the next sequence number we must see
    last: FrameHeader | None = None  # the last valid frame, if in the current file
    cut: FileEnd | None = None  # a bad frame that ended the journal
    data_ends: dict[pathlib.Path, int] = {}

    for jf in files:
        with mapped(jf.path) as data:
            if cut is not None:
                # Past a torn write nothing valid may exist.
                later = next(valid_frames_after(data, 0, jf.path), None)
                if later is not None:
                    raise JournalCorrupt(
                        str(cut.path),
                        cut.offset,
                        f"{cut.reason}, but {later.path.name} at offset {later.offset} "
                        f"holds a valid frame (sequence {later.header.first_sequence}) "
                        "written after it",
                    )
                result.empty_files.append(jf.path)
                continue
            last = None
            has_frames = False
            for item in read_frames(data, jf.path):
                if isinstance(item, FrameRecord):
                    h = item.header
                    want = expected if expected is not None else jf.first_sequence
                    if h.first_sequence != want:
                        raise JournalCorrupt(
                            str(jf.path),
                            item.offset,
                            f"sequence gap: expected a frame starting at {want}, "
                            f"found {h.first_sequence}",
                        )
                    if h.epoch < result.max_epoch:
                        raise JournalCorrupt(
                            str(jf.path),
                            item.offset,
                            f"epoch went down from {result.max_epoch} to {h.epoch}",
                        )
                    seq = h.first_sequence
                    if not has_frames and on_file is not None:
                        on_file(jf.first_sequence)
                    operations = item.operations()
                    ends = operation_ends(item.payload) if on_data is not None else None
                    payload_at = item.offset + HEADER_SIZE
                    for k, op in enumerate(operations):
                        kind = op.WhichOneof("kind")
                        if kind == "checkpoint":
                            result.checkpoints.append(seq)
                        if on_data is not None and ends is not None and kind == "append":
                            n = len(op.append.data)
                            at = payload_at + ends[k] - n
                            if n and data[at : at + n] == op.append.data:
                                on_data(jf.path, at)
                        if replay is not None:
                            replay(seq, op)
                        seq += 1
                    result.frames += 1
                    result.operations += h.operation_count
                    result.max_epoch = h.epoch
                    expected = h.end_sequence
                    last = h
                    has_frames = True
                    continue
                # FileEnd: decide between clean end, torn write and corruption.
                data_ends[jf.path] = item.offset
                later_frames = list(valid_frames_after(data, item.offset + 1, jf.path))
                if later_frames:
                    # Unsynced when the writer stopped, and so never
                    # acknowledged: the group the tear is in (its later frames
                    # may be whole) and the one written while it synced (the
                    # journal overlaps a group's write with the previous
                    # group's fdatasync; never more than two). Anything else
                    # after a bad frame was synced: corruption.
                    base = last.end_sequence if last is not None else jf.first_sequence
                    allowed = {base} if last is None else {last.group_sequence, base}
                    extra: int | None = None
                    foreign = []
                    for r in later_frames:
                        g = r.header.group_sequence
                        if g in allowed:
                            continue
                        if extra is None and g > base:
                            extra = g
                            allowed.add(g)
                            continue
                        foreign.append(r)
                    if foreign:
                        r = foreign[0]
                        raise JournalCorrupt(
                            str(jf.path),
                            item.offset,
                            f"{item.reason or 'unexpected end'}, but a valid frame of a later "
                            f"write group (sequence {r.header.first_sequence}) follows at "
                            f"offset {r.offset}",
                        )
                    cut = FileEnd(jf.path, item.offset, item.reason or "short frame")
                elif not item.is_clean:
                    cut = item
            if has_frames:
                result.files.append(jf)
                result.data_bytes += data_ends[jf.path]
            else:
                result.empty_files.append(jf.path)

    if cut is not None:
        result.torn = cut
    result.next_sequence = (
        expected if expected is not None else (files[0].first_sequence if files else 1)
    )
    if repair:
        _repair(directory, result, data_ends)
    return result


def _repair(
    directory: pathlib.Path, result: ReplayResult, data_ends: dict[pathlib.Path, int]
) -> None:
    """Cut the torn tail, drop preallocated space of the last file, delete empty files."""
    if result.torn is not None:
        log.warning(
            "journal: cutting off a torn write at %s offset %d (%s); it was never acknowledged",
            result.torn.path,
            result.torn.offset,
            result.torn.reason,
        )
    if result.files:
        last = result.files[-1].path
        end = data_ends[last]
        if os.stat(last).st_size != end:
            # Durable before any new frame is written: otherwise a crash could
            # leave the garbage followed by newer frames, which reads as corruption.
            with last.open("r+b") as f:
                os.ftruncate(f.fileno(), end)
                os.fsync(f.fileno())
    for path in result.empty_files:
        log.info("journal: removing %s (holds no frames)", path.name)
        path.unlink()
    if result.empty_files:
        fsync_directory(directory)


def read_groups(
    files: Sequence[tuple[int, pathlib.Path]], from_sequence: int, limit: int, max_bytes: int
) -> tuple[bytes, int, bool]:
    """Whole write groups of frames, byte for byte, from ``from_sequence`` (a group's first
    sequence) up to ``limit``: (frames, the next sequence, whether ``limit`` was reached).

    ``files`` are (first sequence, path) of a journal's files, oldest first.
    At least one group is returned when there is one, even past
    ``max_bytes``; frames past a bad one (a write in progress) are not read.
    A file deleted meanwhile ends the read early. Files are read with
    ``pread``, never memory-mapped: a writer may cut a file down (sealing it)
    while this reads, and a mapped page past the new end would be SIGBUS.
    """
    out: list[bytes] = []
    size = 0
    seq = from_sequence
    starts = [first for first, _ in files]
    index = max(0, bisect.bisect_right(starts, from_sequence) - 1)
    for _, path in files[index:]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            break
        try:
            group: list[bytes] = []
            group_seq = -1
            group_end = seq
            group_at = 0  # the offset of the group's first frame: where the next read resumes
            for header, frame, offset in _pread_frames(fd, path, seq):
                if header.end_sequence <= seq:
                    continue
                if header.group_sequence != group_seq and group:
                    if size and size + sum(map(len, group)) > max_bytes:
                        _remember(path, seq, group_at)
                        return b"".join(out), seq, False
                    out.extend(group)
                    size += sum(map(len, group))
                    seq = group_end
                    group = []
                if header.first_sequence >= limit:
                    _remember(path, seq, offset)
                    break
                group_seq = header.group_sequence
                if not group:
                    group_at = offset
                group.append(frame)
                group_end = header.end_sequence
            if group:
                if size and size + sum(map(len, group)) > max_bytes:
                    _remember(path, seq, group_at)
                    return b"".join(out), seq, False
                out.extend(group)
                size += sum(map(len, group))
                seq = group_end
        finally:
            os.close(fd)
        if seq >= limit:
            break
    return b"".join(out), seq, seq >= limit


#: Where a read of a file stopped: (path, next sequence) -> that frame's offset,
#: so that a reader going through a long file in pieces (a catch-up) does not
#: walk it from the start every time.
_RESUME: dict[tuple[pathlib.Path, int], int] = {}
_RESUME_MAX = 256


def _remember(path: pathlib.Path, sequence: int, offset: int) -> None:
    if len(_RESUME) >= _RESUME_MAX:
        _RESUME.clear()
    _RESUME[(path, sequence)] = offset


def _pread_frames(
    fd: int, path: pathlib.Path, from_sequence: int
) -> Iterator[tuple[FrameHeader, bytes, int]]:
    """The valid frames of a file (header, whole frame, offset) until the first bad one,
    starting where a read for ``from_sequence`` stopped before (if it is still there)."""
    offset = _RESUME.pop((path, from_sequence), 0)
    if offset:
        frames = _frames_in(fd, offset)
        first = next(frames, None)
        if first is not None and first[0].first_sequence == from_sequence:
            for header, head, payload, at in itertools.chain((first,), frames):
                yield header, head + payload, at
            return
        # The remembered place is gone: from the start.
    for header, head, payload, at in _frames_in(fd, 0):
        yield header, head + payload, at


@dataclass(frozen=True)
class GroupEnd:
    """Where a write group ends in a journal's files (`group_ending_at`)."""

    #: The file, and the byte offset just past the group's last frame.
    path: pathlib.Path
    offset: int
    #: The last frame's header bytes, as stored (its payload's CRC included).
    header: bytes


def group_ending_at(files: Sequence[tuple[int, pathlib.Path]], sequence: int) -> GroupEnd | None:
    """The end of the write group that ends just below ``sequence``; None if no valid
    frame ends there, or one does in the middle of a group (or a file is gone).

    ``files`` are (first sequence, path), oldest first. Reads only the file
    holding that frame (a group never spans files).
    """
    starts = [first for first, _ in files]
    index = bisect.bisect_left(starts, sequence) - 1
    if index < 0:
        return None
    path = files[index][1]
    found: GroupEnd | None = None
    group = -1
    try:
        for header, head, payload, at in frames_from(path, 0):
            if found is not None:
                # A frame of the same group follows: not where a group ends.
                return None if header.group_sequence == group else found
            if header.end_sequence == sequence:
                end = at + HEADER_SIZE + len(payload)
                found, group = GroupEnd(path, end, head), header.group_sequence
            elif header.end_sequence > sequence:
                return None
    except FileNotFoundError:
        return None
    return found


def frames_from(path: pathlib.Path, offset: int) -> Iterator[tuple[FrameHeader, bytes, bytes, int]]:
    """The valid frames of a file from ``offset`` (header, its bytes as stored, payload,
    the frame's offset), read with ``pread``, until the first bad one or the end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield from _frames_in(fd, offset)
    finally:
        os.close(fd)


def _frames_in(fd: int, offset: int) -> Iterator[tuple[FrameHeader, bytes, bytes, int]]:
    """`frames_from` on an open file."""
    while True:
        head = os.pread(fd, HEADER_SIZE, offset)
        if len(head) < HEADER_SIZE:
            return
        try:
            header = decode_header(head)
        except FrameError:
            return
        payload = os.pread(fd, header.payload_length, offset + HEADER_SIZE)
        if len(payload) < header.payload_length or not frame_crc_ok(head, payload):
            return
        yield header, head, payload, offset
        offset += HEADER_SIZE + header.payload_length
