"""``append``: the input (a file or stdin) into a segment or stream, exactly once.

The input pump reads the input in blocks of whole events (`_read_blocks`,
`_frames`), each one append, cut to the room a stream's segment has left
(`_RollRoom`); an exactly-once writer sends them, and `_StoredInput` keeps
how much of the input is stored, so a run that gives up can say where to
resume. ``txn append`` runs the same command (`cmd_append`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from gateway.cli.common import Commands, add_command, connect_settings, tls_options
from gateway.cli.values import MAX_TIMEOUT, seconds, writer_uuid
from gateway.errors import GatewayError, os_reason
from gateway.progress import Progress, shown

#: Input read per append by `append` (every input format): large enough that
#: per-append costs vanish, within the daemon's max_append_bytes. To a
#: stream with a roll size, at most the room its segment has left (`_RollRoom`).
APPEND_BLOCK = 4 << 20
#: Bytes `append` keeps unacknowledged: a few journal groups (journal.
#: max_group_bytes, 8 MiB), so the journal always has the next fdatasync's
#: worth waiting; below the daemon's server.max_inflight_bytes (32 MiB).
APPEND_WINDOW = 16 << 20


def _read_some(stream: BinaryIO, size: int, regular: bool) -> bytes:
    """Up to ``size`` bytes; b"" at the end. From a pipe or terminal, what is there now
    (at least one byte), so a slow producer's input is appended as it comes."""
    if regular:
        return stream.read(size)
    import select

    data = stream.read1(size)  # type: ignore[attr-defined]
    if not data or len(data) >= size:
        return data  # type: ignore[no-any-return]
    parts, n = [data], len(data)
    while n < size and select.select([stream], [], [], 0)[0]:
        more = stream.read1(size - n)  # type: ignore[attr-defined]
        if not more:
            break  # the end: the next call says so
        parts.append(more)
        n += len(more)
    return b"".join(parts)


def _read_blocks(stream: BinaryIO, lines: bool, size: int | Callable[[], int]) -> Any:
    """The input as blocks of encoded events, each with the input bytes it took.

    Raw: each read is one event. Lines: whole lines, each ending with the
    newline that the lines codec encodes an event with, so a block is
    exactly what writing its lines one by one would have sent; a last line
    without a newline is one event all the same (the newline is added).
    Blocks are at most ``size`` bytes, but for a line that is longer alone.
    ``size`` may be a function: it is asked before each block (the room left
    in a stream's segment, `_RollRoom`).
    """
    limit = size if callable(size) else lambda: size
    regular = _is_regular(stream)
    if not lines:
        while chunk := _read_some(stream, limit(), regular):
            yield chunk, len(chunk)
        return
    # Input read and not handed out yet: ``rest`` (a line begun, no newline
    # in it) and then ``chunk[pos:]``. A block must be one immutable buffer
    # (kept until acknowledged, for resends): whole lines are copied into it
    # once, and only a line cut by a read once more (into ``rest``).
    rest, chunk, pos = b"", b"", 0
    while True:
        most = limit()
        end = pos + most - len(rest)  # where ``most`` bytes end in ``chunk``
        cut = chunk.rfind(b"\n", pos, min(end, len(chunk))) + 1 if end > pos else 0
        if not cut:
            # No whole line within ``most`` bytes: a line longer than that
            # (a block of its own), or more input is needed.
            cut = chunk.find(b"\n", pos) + 1
        if cut:
            whole = not rest and pos == 0 and cut == len(chunk)
            block = chunk if whole else b"".join((rest, memoryview(chunk)[pos:cut]))
            rest, pos = b"", cut
            yield block, len(block)
            continue
        rest += chunk[pos:]
        pos = 0
        chunk = _read_some(stream, most - len(rest) if len(rest) < most else most, regular)
        if not chunk:
            break
    if rest:
        yield rest + b"\n", len(rest)


class _RollRoom:
    """How large the next append to a stream may be, so its segment ends near its roll size.

    The daemon seals a stream's current segment before the first append
    that finds it holding ``roll_size`` bytes or more: an append is never
    split, so a segment passes ``roll_size`` by what its last append took
    beyond it. Appends cut to the room left (at event boundaries) make each
    segment end within one event past ``roll_size``. Predicted from the
    segment's length when the command started and this command's own
    appends, in order: exact for one writer; another writer's appends, or a
    roll by age meanwhile, can make one segment longer by up to one of them.
    """

    def __init__(self, roll_size: int, filled: int) -> None:
        self.roll_size = roll_size
        #: Bytes in the current segment (once it holds ``roll_size``, the next append rolls).
        self.filled = filled

    def room(self) -> int:
        """Bytes the next append may hold (at least 1)."""
        return self.roll_size - self.filled if self.filled < self.roll_size else self.roll_size

    def add(self, nbytes: int) -> None:
        """An append of ``nbytes`` went out (after the ones before it)."""
        self.filled = (self.filled if self.filled < self.roll_size else 0) + nbytes


async def _roll_room(client: Any, name: str) -> _RollRoom | None:
    """The room of a stream with a roll size; None for a segment (or no roll size)."""
    from gateway.errors import SegmentNotFound

    try:
        info = await client.stream(name)
    except SegmentNotFound:  # StreamNotFound: a plain segment
        return None
    if not info.roll_size:
        return None
    last = info.segments[-1] if info.segments else None
    return _RollRoom(info.roll_size, last.length if last is not None and not last.sealed else 0)


def _frames(block: bytes, consumed: int, limit: Callable[[], int]) -> Any:
    """A block of lines as blocks of frames (4-byte length, then the line), each within
    ``limit()`` but for a single frame, with the input bytes each took."""
    pack = _FRAME_LENGTH.pack
    buf, events, took, total = bytearray(), 0, 0, 0
    for line in block.split(b"\n")[:-1]:
        frame_bytes = 4 + len(line)
        if buf and len(buf) + frame_bytes > limit():
            yield bytes(buf), events, took
            total += took
            buf, events, took = bytearray(), 0, 0
        buf += pack(len(line))
        buf += line
        events += 1
        took += len(line) + 1
    # The last line of the input may have had no newline: it took one byte less.
    yield bytes(buf), events, consumed - total


_FRAME_LENGTH = struct.Struct(">I")


def _is_regular(stream: BinaryIO) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):
        return False


class _StoredInput:
    """How much of the input an exactly-once writer has stored: where to resume.

    Events are numbered in input order, so the input offset where an event
    ends tells, once the writer's stored event number is known, how many
    input bytes are in the segment. Input is added a batch at a time (one
    event, or a block of them sent as one append); the daemon stores a
    writer's events an append at a time, so its stored event number always
    ends a batch and the offset is exact. Only the batches not yet
    acknowledged are kept (about a window's worth).
    """

    def __init__(self, first_event: int) -> None:
        #: The number of this run's first event.
        self.first_event = first_event
        #: Input bytes read and handed to the writer.
        self.offset = 0
        #: Input bytes known to be stored (those of events up to a stored one).
        self.stored = 0
        self._last = first_event - 1  # the last event added
        #: (number of a batch's last event, input offset where it ends), in order.
        self._ends: collections.deque[tuple[int, int]] = collections.deque()

    def add(self, consumed: int, events: int = 1) -> None:
        """The next ``events`` events took ``consumed`` bytes of the input."""
        self.offset += consumed
        self._last += events
        self._ends.append((self._last, self.offset))

    def advance(self, stored_event: int) -> int:
        """Events up to ``stored_event`` are stored; returns the input bytes stored."""
        ends = self._ends
        while ends and ends[0][0] <= stored_event:
            self.stored = ends.popleft()[1]
        return self.stored


async def _length_text(client: Any, name: str) -> str:
    """How long a segment is, or for a stream, how long its current segment is."""
    from gateway.errors import NotOwner, SegmentNotFound

    try:
        return f"{(await client.info(name)).length} bytes long"
    except (SegmentNotFound, NotOwner):  # a stream (NotOwner: on another node)
        stream = await client.stream(name)
        if not stream.segments:
            return "a stream without segments"
        last = stream.segments[-1]
        return (
            f"a stream of {len(stream.segments)} segment(s), {last.name} {last.length} bytes long"
        )


def cmd_append(args: argparse.Namespace) -> int:
    import shlex
    import uuid

    import trio

    from gateway.client.client import open_client
    from gateway.client.writer import SegmentWriter, WriterFailed, close_writer, open_segment_writer
    from gateway.errors import TooLarge

    address, token = connect_settings(args)
    tls = tls_options(args)
    mode = "framed" if args.framed else "raw" if args.raw else "lines"
    writer_id = uuid.UUID(args.writer_id).bytes if args.writer_id else None

    async def gave_up(e: WriterFailed, w: SegmentWriter, track: _StoredInput, size: int) -> None:
        """Say how much of the input is stored, and how to append the rest."""
        stored_event, length, sure = w.acked_event, "unknown", False
        # The writer stopped; the daemon knows what it stored even if an
        # acknowledgement never came back. Appends sent may still wait in
        # the daemon (behind a full disk): closing the writer id makes what
        # it says now final, so the resume below cannot overlap them.
        with trio.move_on_after(10):
            try:
                async with open_client(address, token, **tls) as client:
                    stored_event = await close_writer(
                        client, args.segment, w.writer_id, stored_event
                    )
                    length = await _length_text(client, args.segment)
                    sure = True
            except GatewayError:
                pass
        stored = track.advance(stored_event)
        writer = str(uuid.UUID(bytes=w.writer_id))
        events = (
            f"events {track.first_event}-{stored_event}"
            if stored_event >= track.first_event
            else "no event of this run"
        )
        what = f"{args.file} ({size} bytes)" if args.file else f"the {track.offset} bytes read"
        print(f"segment-gateway: {e}", file=sys.stderr)
        print(
            f"segment-gateway: stored: the first {stored} bytes of {what}"
            + ("" if sure else " at least (the daemon did not answer)")
            + f", {events} of writer {writer}; {args.segment} is {length}",
            file=sys.stderr,
        )
        if args.file:
            command = ["segment-gateway", "append"]
            if args.connect:
                command += ["--connect", args.connect]
            command += [f"--{mode}"] if mode != "lines" else []
            # A new writer id: this one is closed (a resume numbers its
            # events afresh, from its own first block).
            command += [args.segment]
            print(
                f"segment-gateway: resume at byte {stored} of the file: tail -c +{stored + 1} "
                f"{shlex.quote(args.file)} | {shlex.join(command)}",
                file=sys.stderr,
            )

    # Input is read in blocks, in a thread.
    try:
        source: BinaryIO = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
        size = os.fstat(source.fileno()).st_size if args.file else 0
    except OSError as e:
        raise GatewayError.from_text(f"cannot read {args.file}: {os_reason(e)}") from None

    async def main() -> int:
        async with open_client(address, token, **tls) as client:
            if args.create:
                from gateway.errors import SegmentExists

                with contextlib.suppress(SegmentExists):
                    await client.create(args.segment, codec=mode)
            # A stream: appends within the room its current segment has left.
            roll = await _roll_room(client, args.segment)
        count = nbytes = 0
        started = time.monotonic()
        w: SegmentWriter | None = None
        track = _StoredInput(1)
        # Input bytes stored (acknowledged); not while someone types the input.
        typed = not args.file and sys.stdin.isatty()
        show = shown(getattr(args, "quiet", False)) and not typed  # `txn append` has no --quiet
        bar = Progress(f"append {args.segment}", size or None, show=show)
        try:
            async with open_segment_writer(
                address,
                args.segment,
                codec=mode,
                token=token,
                writer_id=writer_id,
                reconnect_timeout=args.timeout,
                max_inflight_bytes=APPEND_WINDOW,
                **tls,
            ) as w:
                track = _StoredInput(w.next_event_number)
                most = min(APPEND_BLOCK, w.max_append_bytes or APPEND_BLOCK)

                def limit() -> int:
                    return min(most, roll.room()) if roll is not None else most

                # Blocks of whole events, one append each, no per-event work
                # (framed: lines framed here, a Python loop per line).
                blocks = _read_blocks(source, mode != "raw", limit)
                # Read in a thread: the writer sends and takes acks meanwhile,
                # and a slow producer's lines go out as they come.
                while item := await trio.to_thread.run_sync(
                    next, blocks, None, abandon_on_cancel=True
                ):
                    pieces = [item] if mode != "framed" else _frames(item[0], item[1], limit)
                    for piece in pieces:
                        block, consumed = piece[0], piece[-1]
                        if w.max_append_bytes and len(block) > w.max_append_bytes:
                            encoded = "newline" if mode == "lines" else "4-byte length"
                            raise TooLarge(
                                f"the line at byte {track.offset} of the input, with its "
                                f"{encoded},",
                                len(block),
                                w.max_append_bytes,
                            )
                        first = w.next_event_number
                        try:
                            await w.write_encoded(block)
                        finally:
                            # Queued (and perhaps sent), even if waiting then failed.
                            events = w.next_event_number - first
                            if events:
                                track.add(consumed, events)
                                if roll is not None:
                                    roll.add(len(block))
                        bar.reach(track.advance(w.acked_event))
                        count += events
                        # What the segment grows by: the events as encoded.
                        nbytes += len(block)
            bar.reach(track.offset)  # the writer closed: everything is acknowledged
        except WriterFailed as e:
            bar.close()
            if w is None:
                raise
            await gave_up(e, w, track, size)
            return e.exit_code
        finally:
            bar.close()
        async with open_client(address, token, **tls) as client:
            length = await _length_text(client, args.segment)
        print(
            f"appended {count} event(s), {nbytes} bytes, to {args.segment} in "
            f"{time.monotonic() - started:.2f}s; it is {length} now",
            file=sys.stderr,
        )
        return 0

    try:
        return trio.run(main)
    finally:
        if args.file:
            source.close()


def _add_append(sub: Commands) -> None:
    p = add_command(sub, "append", cmd_append, "append events from stdin or a file (one per "
                    "line unless --raw or --framed)", client=True, progress=True)  # fmt: skip
    p.add_argument("segment", metavar="SEGMENT",
                   help="the segment or stream to append to")  # fmt: skip
    p.add_argument("--file", help="read this file instead of stdin")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--framed", action="store_true",
                     help="write each line as a framed event (length + payload)")  # fmt: skip
    fmt.add_argument("--raw", action="store_true", help="append the input bytes as they are "
                     "(each read of up to 4 MiB is one event)")  # fmt: skip
    p.add_argument("--create", action="store_true",
                   help="create the segment if missing, with the codec of the input "
                   "(lines, framed or raw)")  # fmt: skip
    p.add_argument("--timeout", type=seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="give up (exit 25) once the daemon has been unreachable or "
                   "overloaded this long (default 60)")  # fmt: skip
    p.add_argument("--writer-id", metavar="UUID", type=writer_uuid,
                   help="continue an exactly-once writer (default: a new one)")  # fmt: skip


def register(sub: Commands) -> None:
    """Add ``append``."""
    _add_append(sub)
