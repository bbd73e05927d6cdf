"""The journal of replicas: other nodes' write groups, kept on this node's disk.

A node that replicates its journal (``replication.write_quorum > 1``) sends
each write group to its ensemble's peers; each peer keeps it here, in one
*log* per source node and epoch, never mixed with its own journal::

    <data_dir>/replicas/<source>/FENCE                      epochs below this are refused
    <data_dir>/replicas/<source>/e<epoch, 20 digits>/<first sequence, 20 digits>.wal
    <data_dir>/replicas/<source>/e<epoch, 20 digits>/CAUGHT_UP

The files hold the source's frames byte for byte (docs/FORMATS.md,
"Journal"), so a log is a journal directory `replay_journal` reads, and
recovery installs one as the rebuilt node's journal. A log holds the frames
of sequences ``[start, next)``, contiguous, fdatasync'd before a write is
answered; writes are made durable by one committer task, which writes every
queued write and then syncs each touched file once (group commit across
sources, BookKeeper's journal).

Fencing (BookKeeper's recovery read): `fence` records, durably, that the
source's epochs below a number are refused from now on; a write from such an
epoch gets `ReplicaFenced`, so a zombie cannot be acknowledged by this node.
Truncation follows the source: it says where its oldest journal file
starts, and files holding only earlier frames go. A full disk refuses the
write (`Overloaded`); the node's own journal keeps its reserve.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import shutil
import tempfile
from dataclasses import dataclass, field

import trio

from gateway.config import JournalConfig
from gateway.errors import (
    BadRequest,
    GatewayError,
    JournalCorrupt,
    JournalRefused,
    Overloaded,
    ReplicaFenced,
    ReplicaGap,
)
from gateway.journal.files import JournalFile, copy_range, fsync_directory
from gateway.journal.format import HEADER_SIZE, operation_ends
from gateway.journal.reader import (
    FileEnd,
    GroupEnd,
    frames_from,
    group_ending_at,
    read_frames,
    read_groups,
    replay_journal,
)
from gateway.protocol.journal_pb2 import Frame

log = logging.getLogger(__name__)

FENCE_NAME = "FENCE"
CAUGHT_UP_NAME = "CAUGHT_UP"
_EPOCH_DIR = re.compile(r"^e([0-9]{20})$")
_SOURCE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def valid_source(name: str) -> bool:
    """Whether ``name`` can be a node id here (a directory name, never ``.`` or ``..``)."""
    return _SOURCE.fullmatch(name) is not None and name not in (".", "..")


#: Frames per read answer unless the reader asks for less.
READ_BYTES = 4 * 1024 * 1024


def epoch_dir_name(epoch: int) -> str:
    """The directory of one source epoch's log."""
    return f"e{epoch:020d}"


@dataclass
class ReplicaLog:
    """One source epoch's log on this node."""

    source: str
    epoch: int
    directory: pathlib.Path
    #: Durable frames: sequences [start, next).
    start: int = 0
    next: int = 0
    caught_up: bool = False
    #: (first sequence, path) of each file, oldest first.
    files: list[tuple[int, pathlib.Path]] = field(default_factory=list)
    active: JournalFile | None = None
    disk_bytes: int = 0
    #: The next sequence the queued writes will have reached (checked in order).
    queued_next: int = 0


@dataclass
class _Tails:
    """Where one log holds each segment's appended bytes (built on demand, for reads of a
    down owner's unflushed tail)."""

    start: int
    #: The next file (index in the log's files) and offset to scan from.
    file_index: int = 0
    offset: int = 0
    #: segment id -> (segment offset, length, file, file offset of the data), in order.
    appends: dict[int, list[tuple[int, int, pathlib.Path, int]]] = field(default_factory=dict)


@dataclass
class _Write:
    source: str
    epoch: int
    first_sequence: int
    frames: bytes
    start: bool
    caught_up: bool
    truncate_before: int
    drop_before: int
    #: With ``start``: begin from this epoch's log below first_sequence (0: empty).
    seed_epoch: int = 0
    seed_header: bytes = b""
    done: trio.Event = field(default_factory=trio.Event)
    error: GatewayError | None = None
    log: ReplicaLog | None = None
    result: int = 0


@dataclass(frozen=True)
class ReplicaStatistics:
    """What this node holds for others (metrics, ``segment-gateway cluster``)."""

    #: source -> (epochs held, bytes on disk, fenced below).
    sources: dict[str, tuple[list[int], int, int]]
    writes: int
    write_bytes: int
    refused: int


class ReplicaStore:
    """The replica logs under one directory; `run` is its committer."""

    def __init__(self, node_id: str, directory: pathlib.Path, config: JournalConfig) -> None:
        self.node_id = node_id
        self.directory = directory
        self._cfg = config
        self._logs: dict[tuple[str, int], ReplicaLog] = {}
        self._fences: dict[str, int] = {}
        self._queue: list[_Write] = []
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self._writes = 0
        self._write_bytes = 0
        self._refused = 0
        self._closed = False
        #: Logs whose file failed to sync in the batch being committed.
        self._broken: set[tuple[str, int]] = set()
        #: Per log, where its appends are (`read_tail`).
        self._tails: dict[tuple[str, int], _Tails] = {}

    # -- opening ---------------------------------------------------------------

    def open(self) -> None:
        """Find the logs on disk, cutting torn tails (blocking: call in a thread)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for source_dir in sorted(self.directory.iterdir()):
            if not source_dir.is_dir() or not valid_source(source_dir.name):
                continue
            source = source_dir.name
            with contextlib.suppress(OSError, ValueError):
                self._fences[source] = int((source_dir / FENCE_NAME).read_text().strip())
            for epoch_dir in sorted(source_dir.iterdir()):
                m = _EPOCH_DIR.match(epoch_dir.name)
                if m is None or not epoch_dir.is_dir():
                    continue
                epoch = int(m.group(1))
                try:
                    found = replay_journal(epoch_dir, repair=True)
                except JournalCorrupt as e:
                    # Not this node's data: a damaged copy is dropped, never served.
                    log.error("replicas: dropping the log of node %s epoch %d: %s",
                              source, epoch, e)  # fmt: skip
                    shutil.rmtree(epoch_dir, ignore_errors=True)
                    continue
                if not found.files:
                    continue
                rl = ReplicaLog(source, epoch, epoch_dir)
                rl.files = [(f.first_sequence, f.path) for f in found.files]
                rl.start = rl.files[0][0]
                rl.next = rl.queued_next = found.next_sequence
                rl.disk_bytes = found.data_bytes
                rl.caught_up = (epoch_dir / CAUGHT_UP_NAME).exists()
                self._logs[(source, epoch)] = rl

    # -- the requests ----------------------------------------------------------

    def fenced_below(self, source: str) -> int:
        """The source's epochs below this are refused (0: none)."""
        return self._fences.get(source, 0)

    def submit(
        self,
        source: str,
        epoch: int,
        first_sequence: int,
        frames: bytes,
        *,
        start: bool = False,
        caught_up: bool = False,
        truncate_before: int = 0,
        drop_before: int = 0,
        seed_epoch: int = 0,
        seed_header: bytes = b"",
    ) -> _Write:
        """Queue a write in arrival order; `wait` for it. Fenced epochs are refused at once.

        ``seed_epoch`` (with ``start``): begin the log with that epoch's log's
        frames below ``first_sequence`` (wire.proto, ReplicaWriteRequest).
        """
        if not valid_source(source) or epoch <= 0:
            raise BadRequest(f"replica write for a bad source {source!r} or epoch {epoch}")
        if seed_epoch and (not start or seed_epoch >= epoch):
            raise BadRequest(f"replica write seeded from epoch {seed_epoch} without a start "
                             f"of a later epoch (epoch {epoch})")  # fmt: skip
        self._check_fence(source, epoch)
        w = _Write(source, epoch, first_sequence, frames, start, caught_up,
                   truncate_before, drop_before, seed_epoch, seed_header)  # fmt: skip
        self._queue.append(w)
        self._wake.set()
        return w

    async def wait(self, w: _Write) -> int:
        """The log's durable next sequence once ``w`` is written and synced."""
        await w.done.wait()
        if w.error is not None:
            raise w.error
        return w.result

    async def fence(self, source: str, epoch: int) -> int:
        """Refuse ``source``'s epochs below ``epoch`` from now on, durably; return the fence."""
        if not valid_source(source):
            raise BadRequest(f"replica fence for a bad source {source!r}")
        current = self._fences.get(source, 0)
        if epoch > current:
            # In force at once (a write checks it before it is written, under
            # the same limiter as this), durable before the answer.
            self._fences[source] = epoch
            await trio.to_thread.run_sync(self._write_fence, source, limiter=self._limiter)
            log.warning("replicas: node %s fenced below epoch %d here (a recovery)", source, epoch)
        return self._fences[source]

    def holdings(self, source: str) -> list[ReplicaLog]:
        """The logs held for ``source``, by epoch."""
        return sorted(
            (rl for (s, _), rl in self._logs.items() if s == source and rl.next > rl.start),
            key=lambda rl: rl.epoch,
        )

    async def read(
        self, source: str, epoch: int, from_sequence: int, max_bytes: int
    ) -> tuple[bytes, int, bool]:
        """Whole frames of a log from ``from_sequence``: (frames, next sequence, end)."""
        rl = self._logs.get((source, epoch))
        if rl is None or from_sequence >= rl.next:
            return b"", from_sequence, True
        if from_sequence < rl.start:
            raise BadRequest(
                f"replica log of node {source} epoch {epoch} starts at {rl.start}, "
                f"not {from_sequence}"
            )
        return await trio.to_thread.run_sync(
            read_groups, list(rl.files), from_sequence, rl.next, max_bytes or READ_BYTES
        )

    def holds(self, source: str) -> bool:
        """Whether a caught-up log of ``source`` is here (its unflushed bytes can be read)."""
        return any(rl.caught_up for rl in self.holdings(source))

    async def read_tail(self, source: str, segment_id: int, offset: int, size: int) -> bytes:
        """Up to ``size`` of a segment's appended bytes from ``offset``, from the newest
        caught-up log of ``source`` (shorter, or empty, where the log does not have them).

        For reads of a down owner's unflushed tail: the log holds every write
        group this node acknowledged for it, so what another node showed of
        the owner's segment is here (unless this replica was the one lagging).
        """
        logs = [rl for rl in self.holdings(source) if rl.caught_up]
        if not logs:
            return b""
        rl = logs[-1]
        return await trio.to_thread.run_sync(
            self._read_tail, rl, segment_id, offset, size, limiter=self._limiter
        )

    def _read_tail(self, rl: ReplicaLog, segment_id: int, offset: int, size: int) -> bytes:
        key = (rl.source, rl.epoch)
        tails = self._tails.get(key)
        if tails is None or tails.start != rl.start:
            tails = self._tails[key] = _Tails(rl.start)
        _scan_appends(rl, tails)
        out = []
        at = offset
        end = offset + size
        for seg_offset, length, path, pos in tails.appends.get(segment_id, ()):
            if seg_offset + length <= at:
                continue
            if seg_offset > at or at >= end:
                break
            skip = at - seg_offset
            n = min(length - skip, end - at)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                break  # truncated: those bytes are in Tier 2 now
            try:
                data = os.pread(fd, n, pos + skip)
            finally:
                os.close(fd)
            out.append(data)
            at += len(data)
            if len(data) < n:
                break
        return b"".join(out)

    def statistics(self) -> ReplicaStatistics:
        """Per source: the epochs held, bytes on disk, the fence."""
        sources: dict[str, tuple[list[int], int, int]] = {}
        for (source, epoch), rl in sorted(self._logs.items()):
            epochs, nbytes, fence = sources.get(source, ([], 0, self.fenced_below(source)))
            sources[source] = ([*epochs, epoch], nbytes + rl.disk_bytes, fence)
        for source, fence in self._fences.items():
            sources.setdefault(source, ([], 0, fence))
        return ReplicaStatistics(sources, self._writes, self._write_bytes, self._refused)

    # -- the committer ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and sync queued writes until cancelled."""
        task_status.started()
        try:
            while True:
                while not self._queue:
                    self._wake = trio.Event()
                    await self._wake.wait()
                batch, self._queue = self._queue, []
                for w in batch:
                    try:
                        self._check_fence(w.source, w.epoch)
                    except GatewayError as e:
                        w.error = e
                try:
                    await trio.to_thread.run_sync(self._commit, batch, limiter=self._limiter)
                except Exception as e:  # never the daemon's end: refuse this batch
                    log.exception("replicas: writing a batch failed")
                    for w in batch:
                        w.error = w.error or Overloaded(f"replica write failed: {e}")
                for w in batch:
                    if w.error is not None:
                        self._refused += 1
                    w.done.set()
        finally:
            self._closed = True
            for w in self._queue:
                w.error = w.error or Overloaded("this node is stopping")
                w.done.set()
            for rl in self._logs.values():
                if rl.active is not None:
                    rl.active.close()
                    rl.active = None

    def _check_fence(self, source: str, epoch: int) -> None:
        fence = self._fences.get(source, 0)
        if epoch < fence:
            raise ReplicaFenced(self.node_id, epoch, source, fence)

    def _commit(self, batch: list[_Write]) -> None:
        """Write every write of the batch, then sync each touched file once (worker thread)."""
        touched: dict[int, JournalFile] = {}
        written: list[_Write] = []
        for w in batch:
            if w.error is not None:
                continue
            try:
                f = self._write(w)
            except GatewayError as e:
                w.error = e
                continue
            except OSError as e:
                w.error = Overloaded(f"replica write failed: {e.strerror or e}")
                log.error("replicas: writing node %s epoch %d: %s", w.source, w.epoch, e)
                continue
            if f is not None:
                touched[id(f)] = f
            written.append(w)
        failed: set[int] = set()
        for key, f in touched.items():
            if f.closed:
                continue  # rolled within this batch: synced before it was sealed
            try:
                f.sync()
            except OSError as e:
                log.critical("replicas: fdatasync of %s failed: %s", f.path, e)
                failed.add(key)
        for w in batch:
            if w.log is not None and (w.log.source, w.log.epoch) in self._broken:
                w.error = w.error or Overloaded("replica fdatasync failed")
        for broken in [self._logs[k] for k in self._broken if k in self._logs]:
            self._drop_log(broken)
            shutil.rmtree(broken.directory, ignore_errors=True)
        self._broken.clear()
        for w in written:
            rl = w.log
            if rl is None or w.error is not None:
                continue  # nothing held, nothing to do; or refused above
            if rl.active is not None and id(rl.active) in failed:
                # The file's state is unknown (as for the journal): the whole
                # log goes, and the source starts it again.
                w.error = Overloaded("replica fdatasync failed")
                self._drop_log(rl)
                shutil.rmtree(rl.directory, ignore_errors=True)
                continue
            if (rl.source, rl.epoch) not in self._logs:
                w.error = w.error or Overloaded("replica fdatasync failed")
                continue
            if w.frames:
                rl.next = max(rl.next, w.result)
            w.result = rl.next
            self._after(w, rl)

    def _write(self, w: _Write) -> JournalFile | None:
        # Again here, under the limiter a fence's write holds: nothing is
        # written past a fence's answer.
        self._check_fence(w.source, w.epoch)
        key = (w.source, w.epoch)
        rl = self._logs.get(key)
        if rl is None and not w.start:
            if w.frames:
                raise ReplicaGap(w.source, w.epoch, 0, w.first_sequence)
            return None  # truncation of a log this node does not hold
        end = _check_frames(w.frames, w.epoch, w.first_sequence) if w.frames else 0
        if w.start or rl is None:
            if rl is not None:
                self._drop_log(rl)
            directory = self.directory / w.source / epoch_dir_name(w.epoch)
            if directory.exists():
                shutil.rmtree(directory)
            seed = self._seed(w) if w.seed_epoch else None
            directory.mkdir(parents=True)
            rl = ReplicaLog(w.source, w.epoch, directory, w.first_sequence, w.first_sequence)
            if seed is not None:
                _plant(seed, rl)
            fsync_directory(directory.parent)
            rl.queued_next = w.first_sequence
            self._logs[key] = rl
        w.log = rl
        if not w.frames:
            w.result = rl.next
            return None
        # Checked against what this batch wrote already (synced together).
        if w.first_sequence != rl.queued_next:
            raise ReplicaGap(w.source, w.epoch, rl.queued_next, w.first_sequence)
        f = rl.active
        if f is None or (f.size > 0 and f.size + len(w.frames) > self._cfg.file_size):
            if f is not None:
                try:
                    f.sync()  # its writes of this batch, before it is closed
                except OSError as e:
                    # As in the batch's own sync: the log cannot be trusted.
                    log.critical("replicas: fdatasync of %s failed: %s", f.path, e)
                    self._broken.add((rl.source, rl.epoch))
                    raise Overloaded(f"replica fdatasync failed: {e.strerror or e}") from e
                f.seal()
            try:
                f = JournalFile.create(
                    rl.directory, w.first_sequence, self._cfg.preallocate_step, len(w.frames)
                )
            except JournalRefused as e:
                rl.active = None
                raise Overloaded(f"replica disk full: {e}") from e
            rl.active = f
            rl.files.append((w.first_sequence, f.path))
        try:
            f.ensure_space(len(w.frames))
        except JournalRefused as e:
            raise Overloaded(f"replica disk full: {e}") from e
        f.write((w.frames,))
        rl.queued_next = end
        rl.disk_bytes += len(w.frames)
        self._writes += 1
        self._write_bytes += len(w.frames)
        w.result = end
        return f

    def _seed(self, w: _Write) -> tuple[ReplicaLog, GroupEnd]:
        """The older log and place a seeded start begins from, or `ReplicaGap`.

        Why the frames below ``w.first_sequence`` are then the source's own:
        the frame ending there has the same header as the source's, so the
        same process wrote it (an epoch is one process, arbitrated in Tier 2),
        and a process never writes a sequence twice. That process's journal
        up to there is what both the source's journal (replayed or recovered
        from it) and that log (streamed from it) hold, frame for frame.
        """
        old = self._logs.get((w.source, w.seed_epoch))
        end = None
        if old is not None and old.start <= w.truncate_before and w.first_sequence <= old.next:
            end = group_ending_at(old.files, w.first_sequence)
        if old is None or end is None or end.header != w.seed_header:
            log.info("replicas: node %s epoch %d: no seed from epoch %d at %d here",
                     w.source, w.epoch, w.seed_epoch, w.first_sequence)  # fmt: skip
            raise ReplicaGap(w.source, w.epoch, 0, w.first_sequence)
        return old, end

    def _after(self, w: _Write, rl: ReplicaLog) -> None:
        """Markers, truncation and dropped epochs once a write is durable (worker thread)."""
        if w.caught_up and not rl.caught_up:
            marker = rl.directory / CAUGHT_UP_NAME
            marker.write_text(f"{rl.next}\n")
            fsync_directory(rl.directory)
            rl.caught_up = True
        if w.truncate_before:
            self._truncate(rl, w.truncate_before)
        if w.drop_before and rl.caught_up:
            # Only once this node's own newer log is caught up: until then the
            # older one is what it can serve a down owner's tail from.
            for (source, epoch), other in list(self._logs.items()):
                if source == w.source and epoch < w.drop_before:
                    self._drop_log(other)
                    shutil.rmtree(other.directory, ignore_errors=True)
                    log.info("replicas: dropped node %s epoch %d (superseded)", source, epoch)

    def _truncate(self, rl: ReplicaLog, before: int) -> None:
        # A file may go when the next one starts at or before the limit.
        doomed = []
        while len(rl.files) >= 2 and rl.files[1][0] <= before:
            doomed.append(rl.files.pop(0))
        for _, path in doomed:
            try:
                rl.disk_bytes -= path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
        if doomed:
            rl.start = rl.files[0][0]
            fsync_directory(rl.directory)

    def _drop_log(self, rl: ReplicaLog) -> None:
        self._tails.pop((rl.source, rl.epoch), None)
        if rl.active is not None:
            rl.active.close()
            rl.active = None
        self._logs.pop((rl.source, rl.epoch), None)

    def _write_fence(self, source: str) -> None:
        epoch = self._fences[source]  # the highest, whatever order fences came in
        directory = self.directory / source
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".fence.")
        with os.fdopen(fd, "w") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / FENCE_NAME)
        fsync_directory(directory)


def _plant(seed: tuple[ReplicaLog, GroupEnd], rl: ReplicaLog) -> None:
    """Give the new log ``rl`` the older log's files up to the seed's group end.

    Files wholly below it are hard links (sealed: nothing writes them again;
    no copy, no new space). The one it ends in is copied up to there and
    synced: the older log may hold frames past it, and links would share
    later writes. ``rl`` then continues in a new file from its ``next``.
    """
    old, end = seed
    for first, path in old.files:
        target = rl.directory / path.name
        if path == end.path:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:
                if copy_range(path, fd, 0, end.offset) < end.offset:
                    raise ReplicaGap(rl.source, rl.epoch, 0, rl.next)  # cut meanwhile
                os.fdatasync(fd)
            finally:
                os.close(fd)
            rl.files.append((first, target))
            rl.disk_bytes += end.offset
            break
        os.link(path, target)
        rl.files.append((first, target))
        rl.disk_bytes += target.stat().st_size
    rl.start = rl.files[0][0]
    fsync_directory(rl.directory)


def _scan_appends(rl: ReplicaLog, tails: _Tails) -> None:
    """Index the appends of the log's durable frames not scanned yet (worker thread)."""
    files = rl.files
    while tails.file_index < len(files):
        path = files[tails.file_index][1]
        last = tails.file_index == len(files) - 1
        try:
            for header, _, payload, at in frames_from(path, tails.offset):
                if header.end_sequence > rl.next:
                    return  # not durable yet: scanned later
                ends = operation_ends(payload) or []
                for k, op in enumerate(Frame.FromString(payload).operations):
                    if op.WhichOneof("kind") != "append" or k >= len(ends):
                        continue
                    a = op.append
                    n = len(a.data)
                    data_at = at + HEADER_SIZE + ends[k] - n
                    tails.appends.setdefault(a.segment_id, []).append((a.offset, n, path, data_at))
                tails.offset = at + HEADER_SIZE + header.payload_length
        except FileNotFoundError:
            pass
        if last:
            return
        tails.file_index += 1
        tails.offset = 0


def _check_frames(frames: bytes, epoch: int, first_sequence: int) -> int:
    """Validate whole frames of ``epoch`` from ``first_sequence``; return the next sequence."""
    seq = first_sequence
    where = pathlib.Path("<replica write>")
    for item in read_frames(frames, where):
        if isinstance(item, FileEnd):
            if item.reason is not None:
                raise BadRequest(f"replica write holds a bad frame at {item.offset}: {item.reason}")
            break
        h = item.header
        # A catch-up carries the source's older epochs' frames too.
        if h.epoch > epoch or h.first_sequence != seq:
            raise BadRequest(
                f"replica write frame at {item.offset} has epoch {h.epoch} sequence "
                f"{h.first_sequence}, expected at most epoch {epoch} and sequence {seq}"
            )
        seq = h.end_sequence
    if seq == first_sequence:
        raise BadRequest("replica write holds no frame")
    return seq
