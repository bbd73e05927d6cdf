"""The ``segment-gateway`` command.

Each subcommand is a function taking the parsed arguments and returning an
exit code. A `GatewayError` ends the command with its one-line message on
stderr and its exit code, never a traceback (docs/OPERATIONS.md lists the
codes). Commands that talk to a daemon take ``--connect HOST:PORT`` (default:
``server.listen`` of the configuration), ``--token`` and the TLS flags
(``--tls-ca FILE`` or ``--tls``; docs/SECURITY.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, BinaryIO, NoReturn

import trio

from gateway import __version__, logs
from gateway.config import DEFAULT_CONFIG_PATH, Config
from gateway.errors import BadRequest, GatewayError, Unavailable, os_reason

Command = Callable[[argparse.Namespace], int]


def _config(args: argparse.Namespace, check_files: bool = True) -> Config:
    """The configuration: --config if given, else the default file if it exists."""
    if args.config:
        return Config.load(args.config, check_files=check_files)
    if DEFAULT_CONFIG_PATH.exists():
        return Config.load(DEFAULT_CONFIG_PATH, check_files=check_files)
    return Config()


def _connect(args: argparse.Namespace) -> tuple[str, str]:
    # A client needs listen and token only: not the daemon's TLS key, which
    # is rightly unreadable to the users who run these commands -- nor, for
    # the same reason (it holds the token), perhaps the default file itself.
    default_unreadable = not os.access(DEFAULT_CONFIG_PATH, os.R_OK)
    if not args.config and DEFAULT_CONFIG_PATH.exists() and default_unreadable:
        config = Config()
    else:
        config = _config(args, check_files=False)
    address = args.connect or config.server.listen
    token = args.token or os.environ.get("SEGMENT_GATEWAY_TOKEN", "") or config.server.token
    return address, token


def _tls(args: argparse.Namespace) -> dict[str, Any]:
    """``open_client`` keywords for the TLS flags (none: plain TCP)."""
    ca = args.tls_ca or os.environ.get("SEGMENT_GATEWAY_TLS_CA", "")
    if not (ca or args.tls or args.tls_cert or args.tls_key):
        return {}
    from gateway.client.client import client_ssl_context

    context = client_ssl_context(
        ca or None, cert_file=args.tls_cert or None, key_file=args.tls_key or None
    )
    return {"ssl_context": context, "server_hostname": args.tls_server_name}


def _run_client(args: argparse.Namespace, fn: Callable[[Any], Awaitable[int]]) -> int:
    from gateway.client.client import open_client

    address, token = _connect(args)
    tls = _tls(args)

    async def main() -> int:
        async with open_client(address, token, **tls) as client:
            return await fn(client)

    return trio.run(main)


def _info_dict(info: Any) -> dict[str, Any]:
    return dataclasses.asdict(info)


# -- local commands ---------------------------------------------------------------


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"segment-gateway {__version__}")
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    path = args.config_file or args.config or str(DEFAULT_CONFIG_PATH)
    config = Config.load(path)
    print(f"{path}: ok (node {config.node.id}, journal {config.journal_dir})")
    return 0


def _cmd_journal_dump(args: argparse.Namespace) -> int:
    from gateway.journal.dump import dump

    directory = pathlib.Path(args.directory)
    if not directory.is_dir():
        print(f"segment-gateway: {directory}: not a directory", file=sys.stderr)
        return 2
    return dump(directory, sys.stdout, as_json=args.json)


def _cmd_fsck(args: argparse.Namespace) -> int:
    from gateway.fsck import Options, fsck

    # As for client commands, the daemon's TLS files are not needed here.
    config = _config(args, check_files=False)
    if args.data_dir:
        data_dir = str(pathlib.Path(args.data_dir).resolve())
        config = _override(config, {"node": {"data_dir": data_dir}})
    connect = args.connect or ""
    token = args.token or os.environ.get("SEGMENT_GATEWAY_TOKEN", "") or config.server.token
    options = Options(deep=args.deep, repair=args.repair)
    try:
        return fsck(
            config,
            options,
            sys.stdout,
            sys.stderr,
            as_json=args.json,
            connect=connect,
            token=token,
            tls=_tls(args),
            node_dirs_named=bool(args.data_dir or args.config or DEFAULT_CONFIG_PATH.exists()),
        )
    except GatewayError as e:
        if e.exit_code > 1:
            raise
        # Exit 1 means "repaired" for fsck: an error must not read as that.
        print(f"segment-gateway: {e}", file=sys.stderr)
        return 2


def _cmd_pipeline(args: argparse.Namespace) -> int:
    import importlib

    try:
        from pipeline.session import local_session
    except ImportError as e:
        print(f"segment-gateway: the pipeline needs PySpark ({e}); pip install "
              "'segment-gateway[pipeline]'", file=sys.stderr)  # fmt: skip
        return 2
    if not args.job.isidentifier():
        print(f"segment-gateway: no job named {args.job!r}", file=sys.stderr)
        return 2
    try:
        job = importlib.import_module(f"pipeline.jobs.{args.job}")
    except ModuleNotFoundError:
        print(f"segment-gateway: no job named {args.job!r} in pipeline/jobs", file=sys.stderr)
        return 2
    if args.streaming and not hasattr(job, "run_streaming"):
        print(f"segment-gateway: job {args.job!r} has no streaming form", file=sys.stderr)
        return 2
    spark = local_session(f"segment-gateway {args.job}", cores=args.cores)
    try:
        if args.streaming:
            return _stream_job(job, spark, args)
        rows = job.run(spark, args.mount, args.out, args.stream)
    finally:
        spark.stop()
    print(f"{args.job}: {rows} row(s) written to {args.out}")
    return 0


def _stream_job(job: Any, spark: Any, args: argparse.Namespace) -> int:
    """Run a job's streaming query until it ends (--available-now) or Ctrl-C."""
    query = job.run_streaming(
        spark, args.mount, args.out, args.stream, checkpoint=args.checkpoint,
        trigger=args.trigger, available_now=args.available_now,
    )  # fmt: skip
    print(f"{args.job}: streaming to {args.out} (query {query.id}); Ctrl-C stops it",
          file=sys.stderr)  # fmt: skip
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    if query.exception() is not None:
        print(f"segment-gateway: the query failed: {query.exception()}", file=sys.stderr)
        return 1
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"{args.job}: stopped; {rows} event(s) read in the last batches")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.daemon import run_daemon

    # Paths are resolved once, now: resolving the mountpoint again while it
    # is mounted (at SIGHUP) would stat the mount from the event loop that
    # serves it, and wait for itself forever.
    overrides = _serve_overrides(args)

    def load() -> Config:
        """The configuration file with the command line's overrides (again at SIGHUP)."""
        config = _config(args)
        return _override(config, overrides) if overrides else config

    config = load()
    logs.REDACT.add(config.server.token)
    logging.getLogger().setLevel(config.logging.level.upper())
    ready = pathlib.Path(args.ready_file) if args.ready_file else None
    trio.run(run_daemon, config, ready, load, None, args.recover_from_tier2)
    return 0


def _serve_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    if args.listen:
        overrides.setdefault("server", {})["listen"] = args.listen
    if args.metrics_listen is not None:
        overrides.setdefault("metrics", {})["listen"] = args.metrics_listen
    if args.data_dir:
        overrides.setdefault("node", {})["data_dir"] = str(pathlib.Path(args.data_dir).resolve())
    if args.mountpoint is not None:
        mountpoint = str(pathlib.Path(args.mountpoint).resolve()) if args.mountpoint else ""
        overrides.setdefault("fuse", {})["mountpoint"] = mountpoint
    if args.verbose:
        overrides["logging"] = {"level": "debug"}
    return overrides


def _override(config: Config, overrides: dict[str, dict[str, Any]]) -> Config:
    """A copy of ``config`` with some keys replaced (validated like the file)."""
    doc: dict[str, dict[str, Any]] = {
        f.name: dataclasses.asdict(getattr(config, f.name)) for f in dataclasses.fields(config)
    }
    for section, values in overrides.items():
        doc[section].update(values)
    return Config.from_dict(doc, source="command line")


# -- metadata export and import ---------------------------------------------------


def _node_config(args: argparse.Namespace, check_files: bool = True) -> Config:
    """The configuration with ``--data-dir`` applied (commands that act on a node's files)."""
    config = _config(args, check_files=check_files)
    if args.data_dir:
        data_dir = str(pathlib.Path(args.data_dir).resolve())
        config = _override(config, {"node": {"data_dir": data_dir}})
    return config


def _cmd_export_metadata(args: argparse.Namespace) -> int:
    from gateway.recovery import metadata_io

    if args.offline:
        config = _node_config(args, check_files=False)
        snapshot = metadata_io.export_offline(config)
    else:
        unreadable = not os.access(DEFAULT_CONFIG_PATH, os.R_OK)
        if not args.config and DEFAULT_CONFIG_PATH.exists() and unreadable:
            config = Config()  # as for every client command (see _connect)
        else:
            config = _node_config(args, check_files=False)

        answers = []

        async def ask(client: Any) -> int:
            answers.append(await client.export_metadata())
            return 0

        _run_client(args, ask)
        snapshot = answers[0]
    data = metadata_io.encode(snapshot, as_json=args.json)
    trio.run(metadata_io.write_location, args.out, data, config)
    segments = snapshot.container.segments
    chunks = sum(len(s.chunks) for s in segments)
    stored = sum(s.storage_length - s.start_offset for s in segments)
    print(
        f"exported node {snapshot.node!r} (epoch {snapshot.epoch}): {len(segments)} segment(s), "
        f"{chunks} chunk(s), {stored} byte(s) in Tier 2, to {args.out}",
        file=sys.stderr,
    )
    return 0


def _cmd_import_metadata(args: argparse.Namespace) -> int:
    from gateway.recovery import metadata_io

    config = _node_config(args)
    if args.from_tier2 == bool(args.source):
        print("segment-gateway: import-metadata takes a SOURCE or --from-tier2", file=sys.stderr)
        return 2
    if args.from_tier2:
        report = trio.run(metadata_io.recover_from_tier2, config, False)
    else:
        data = trio.run(metadata_io.read_location, args.source, config)
        snapshot = metadata_io.decode(data, args.source)
        report = trio.run(metadata_io.import_metadata, config, snapshot, args.source, False)
    for line in report.summary():
        print(line)
    print(
        f"imported {report.segments} segment(s), {report.stored_bytes} byte(s) in Tier 2, "
        f"into {config.journal_dir}; `serve` starts from them"
    )
    return 0


# -- client commands --------------------------------------------------------------


def _cmd_create(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.create(args.segment, codec=args.codec)
        print(json.dumps(_info_dict(info)))
        return 0

    return _run_client(args, run)


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


def _cmd_append(args: argparse.Namespace) -> int:
    import shlex
    import uuid

    from gateway.client.client import open_client
    from gateway.client.writer import SegmentWriter, WriterFailed, close_writer, open_segment_writer
    from gateway.errors import TooLarge

    address, token = _connect(args)
    tls = _tls(args)
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
                        track.advance(w.acked_event)
                        count += events
                        # What the segment grows by: the events as encoded.
                        nbytes += len(block)
        except WriterFailed as e:
            if w is None:
                raise
            await gave_up(e, w, track, size)
            return e.exit_code
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


def _cmd_cat(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer

    async def run(client: Any) -> int:
        offset = args.offset
        if offset is None:
            offset = (await client.info(args.segment)).start_offset
        while True:
            got = 0
            end = False
            async for piece in client.read_pieces(
                args.segment, offset, 8 << 20, wait=1.0 if args.follow else 0.0
            ):
                out.write(piece.data)
                got += len(piece.data)
                end = piece.end_of_segment or (
                    not args.follow and piece.offset + len(piece.data) >= piece.length
                )
            out.flush()
            offset += got
            if end:
                return 0

    return _run_client(args, run)


def _cmd_ls(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        infos = await client.list(args.prefix)
        if args.json:
            for i in infos:
                print(json.dumps(_info_dict(i)))
        elif args.long:
            for i in infos:
                mtime = time.strftime(
                    "%Y-%m-%d %H:%M:%S", time.localtime(i.last_modified_ms / 1000)
                )
                state = "sealed" if i.sealed else "active"
                events = str(i.event_count) if i.event_count >= 0 else "?"
                print(f"{i.length:>14} {events:>10} {state:6} {mtime} {i.name}")
        else:
            for i in infos:
                print(i.name)
        return 0

    return _run_client(args, run)


def _cmd_stat(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.info(args.segment)
        attrs, more = await client.attribute_range(args.segment, b"", STAT_ATTRIBUTES)
        doc = _info_dict(info)
        if info.event_count < 0:
            doc["event_count"] = None  # cut to what its down owner flushed: not known
        doc["attributes"] = {k.hex(): v for k, v in attrs}
        if more:
            # A segment may have millions (one per exactly-once writer).
            doc["attributes_more_from"] = more.hex()
        print(json.dumps(doc, indent=2))
        return 0

    return _run_client(args, run)


#: Attributes `stat` shows; `attrs` pages through all of them.
STAT_ATTRIBUTES = 100


def _attribute_id(text: str) -> bytes:
    """An attribute id given as 32 hex digits (argparse type)."""
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not hex") from None
    if len(value) != 16:
        raise argparse.ArgumentTypeError(f"{text!r} is not 16 bytes (32 hex digits)")
    return value


def _cmd_attrs(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise BadRequest(f"--limit {args.limit}: must be 0 (all) or more")

    async def run(client: Any) -> int:
        start: bytes = args.start or b""
        left = args.limit
        while True:
            items, start = await client.attribute_range(
                args.segment, start, min(left, 1000) if left else 1000
            )
            for k, v in items:
                print(f"{k.hex()} {v}")
            if left:
                left -= len(items)
            if not start or (args.limit and left <= 0):
                break
        if start:
            print(f"(more: --from {start.hex()})", file=sys.stderr)
        return 0

    return _run_client(args, run)


def _cmd_seal(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.seal(args.segment)
        print(f"sealed {info.name} at length {info.length}")
        return 0

    return _run_client(args, run)


def _cmd_flush(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        # The daemon waits (retrying) up to --timeout and then says what was
        # left; a little longer here, for a daemon that does not answer.
        with trio.move_on_after(args.timeout + FLUSH_ANSWER_GRACE):
            await client.flush(args.segment, args.timeout)
            print(f"flushed {args.segment or 'every segment'} to Tier 2")
            return 0
        raise Unavailable(f"the daemon did not answer the flush within {args.timeout:g}s")

    return _run_client(args, run)


#: How long `flush` waits for the daemon's answer beyond its --timeout.
FLUSH_ANSWER_GRACE = 10.0


def _cmd_truncate(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.truncate(args.segment, args.offset)
        print(f"truncated {info.name}: bytes below {info.start_offset} dropped")
        return 0

    return _run_client(args, run)


def _cmd_delete(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        await client.delete(args.segment)
        print(f"deleted {args.segment}")
        return 0

    return _run_client(args, run)


def _cmd_cluster(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        nodes = await client.cluster()
        if args.json:
            for n in nodes:
                print(json.dumps({
                    "id": n.id, "advertise": n.advertise, "state": n.state, "epoch": n.epoch,
                    "version": n.version, "segments": n.segments,
                    "unflushed_bytes": n.unflushed_bytes,
                    "heartbeat_age_s": n.heartbeat_age_ms / 1000,
                    "started_at_ms": n.started_at_ms, "self": n.self,
                }))  # fmt: skip
            return 0
        print(f"{'NODE':<20} {'STATE':<8} {'ADDRESS':<22} {'SEGMENTS':>9} "
              f"{'UNFLUSHED':>12} {'HEARTBEAT':>10}  EPOCH")  # fmt: skip
        for n in nodes:
            me = " *" if n.self else ""
            age = n.heartbeat_age_ms / 1000
            print(f"{n.id + me:<20} {n.state:<8} {n.advertise:<22} {n.segments:>9} "
                  f"{n.unflushed_bytes:>12} {age:>9.1f}s  {n.epoch}")  # fmt: skip
        down = [n.id for n in nodes if n.state == "down"]
        return 1 if down else 0

    return _run_client(args, run)


#: ``stream`` options -> their policy field (``StreamPolicy``).
_STREAM_OPTIONS = {
    "roll_size": "roll_size",
    "roll_age": "roll_age_ms",
    "retain_size": "retain_size",
    "retain_age": "retain_age_ms",
}


def _stream_policy(args: argparse.Namespace) -> dict[str, int | None]:
    """The policy options given: a value (`_policy_option`), or None for "default"."""
    policy: dict[str, int | None] = {}
    for option, field in _STREAM_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            policy[field] = None if value == "default" else value
    return policy


def _stream_dict(info: Any) -> dict[str, Any]:
    doc = dataclasses.asdict(info)
    doc["segments"] = [s["name"] for s in doc["segments"]]
    doc["length"] = sum(s.length - s.start_offset for s in info.segments)
    return doc


def _cmd_stream(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        action = args.action
        if action == "list":
            for info in await client.list_streams():
                print(json.dumps(_stream_dict(info)))
            return 0
        if not args.name:
            raise BadRequest(f"stream {action} needs a NAME")
        if args.codec is not None and action != "create":
            raise BadRequest("--codec is for stream create: a stream's codec is fixed then")
        if action == "delete":
            await client.delete_stream(args.name)
            print(f"deleted stream {args.name} and its segments")
            return 0
        if action == "create":
            info = await client.create_stream(args.name, _stream_policy(args), args.codec or "raw")
        elif action == "set":
            info = await client.set_stream(args.name, _stream_policy(args))
        elif action == "roll":
            info = await client.roll_stream(args.name)
        else:
            info = await client.stream(args.name)
        print(json.dumps(_stream_dict(info), indent=2))
        return 0

    return _run_client(args, run)


def _cmd_txn(args: argparse.Namespace) -> int:
    from gateway.container.streams import is_hidden
    from gateway.errors import NotATransaction

    if args.action == "append":
        if not is_hidden(args.name):
            # Only `txn begin` makes names there; anything else would be a
            # plain append that the user believes atomic.
            raise NotATransaction(args.name)
        args.segment = args.name
        args.create = False
        return _cmd_append(args)

    async def run(client: Any) -> int:
        if args.action == "begin":
            info = await client.begin_transaction(args.name, args.txn_timeout)
            print(info.name)
        elif args.action == "commit":
            info = await client.commit_transaction(args.name)
            print(json.dumps(dataclasses.asdict(info)))
        else:
            await client.abort_transaction(args.name)
            print(f"aborted {args.name}")
        return 0

    return _run_client(args, run)


# -- argument types: every value checked before anything is done ----------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error."""

    def error(self, message: str) -> NoReturn:
        sub = self.prog.removeprefix("segment-gateway").strip()
        where = f"{sub}: " if sub else ""
        self.exit(2, f"segment-gateway: {where}{message} (see: {self.prog} --help)\n")


def _value_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse type from a parser raising ValueError (its message says why)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name  # argparse names it in some messages
    return convert


def _seconds(lo: float, hi: float, zero: bool = False) -> Callable[[str], float]:
    """Seconds as a number or a duration ("90", "1.5", "2min"), in (lo, hi] (0 too if ``zero``)."""
    from gateway.config import duration_text, parse_duration

    def parse(text: str) -> float:
        value = parse_duration(text)
        if (value == 0 and zero) or lo < value <= hi:
            return value
        bound = f"more than {duration_text(lo)}" if lo else "more than 0"
        raise ValueError(
            f"must be {bound}{' (or 0)' if zero else ''} and at most {duration_text(hi)}, "
            f"got {text!r}"[:200]
        )

    return _value_type(parse, "seconds")


def _integer(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number in [lo, hi] (ASCII digits, an optional minus)."""
    import re

    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*-?[0-9]{1,30}\s*", text):
            raise ValueError(f"expected a whole number, got {text!r}"[:200])
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {value}")
        return value

    return _value_type(parse, "integer")


def _address(text: str) -> str:
    """HOST:PORT (argparse type of --connect)."""
    from gateway.config import parse_host_port

    try:
        parse_host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)[:200]) from None
    return text


def _uuid(text: str) -> str:
    """A writer id: a UUID (argparse type of --writer-id)."""
    import uuid

    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a UUID (e.g. {uuid.UUID(int=0)}), got {text!r}"[:200]
        ) from None


def _policy_option(field: str) -> Callable[[str], int | str]:
    """A stream policy option: a size or duration within the policy's bounds, or "default"."""
    from gateway.config import parse_stream_policy

    def parse(text: str) -> int | str:
        return text if text == "default" else parse_stream_policy(field, text)

    return _value_type(parse, "policy")


#: Offsets (bytes) a segment can have: the journal keeps them as int64.
MAX_OFFSET = 2**63 - 1
#: The longest --timeout of a client command (30 days, as the daemon allows for a flush).
MAX_TIMEOUT = 30 * 86400.0
#: Arguments sent to the daemon as protobuf strings: they must be UTF-8.
_WIRE_TEXT = ("segment", "name", "prefix", "token", "tls_server_name")


def _check_wire_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (one line, exit 2) an argument the wire cannot carry: bytes that are not
    UTF-8 reach Python as lone surrogates."""
    for dest in _WIRE_TEXT:
        value = getattr(args, dest, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                shown = value.encode("utf-8", "surrogateescape")
                parser.error(f"argument {dest.upper()}: {shown!r} is not UTF-8"[:300])


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so docs and tests can inspect it)."""
    parser = _Parser(
        prog="segment-gateway",
        description="Append-only segments: durable in a local journal, tiered to S3, "
        "readable as files through FUSE.",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"configuration file (default {DEFAULT_CONFIG_PATH} if it exists)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, help: str, client: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        if client:
            p.add_argument("--connect", metavar="HOST:PORT", type=_address, help="daemon address "
                           "(default: server.listen of the configuration)")  # fmt: skip
            p.add_argument("--token", help="token (default: $SEGMENT_GATEWAY_TOKEN or "
                           "server.token)")  # fmt: skip
            tls = p.add_argument_group("TLS (a daemon with server.tls_cert)")
            tls.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, trusting "
                             "only this PEM CA (default: $SEGMENT_GATEWAY_TLS_CA)")  # fmt: skip
            tls.add_argument("--tls", action="store_true",
                             help="connect with TLS, trusting the system's CAs")  # fmt: skip
            tls.add_argument("--tls-server-name", metavar="NAME", help="name the server's "
                             "certificate must carry (default: the --connect host)")  # fmt: skip
            tls.add_argument("--tls-cert", metavar="FILE",
                             help="client certificate (PEM), for server.tls_client_ca")  # fmt: skip
            tls.add_argument("--tls-key", metavar="FILE",
                             help="its private key (default: in --tls-cert)")  # fmt: skip
        return p

    add("version", _cmd_version, "print the version")
    p = add("check-config", _cmd_check_config, "validate a configuration file (exit 0 or 2)")
    p.add_argument("config_file", nargs="?", metavar="FILE", help="default: --config")
    p = add("journal-dump", _cmd_journal_dump, "print a journal's frames and whether it is intact")
    p.add_argument("directory", metavar="DIR", help="journal directory (<data_dir>/journal)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p = add("fsck", _cmd_fsck, "check the journal, metadata, Tier-2 chunks and cache "
            "(exit 0 clean, 1 repaired, 2 problems left)", client=True)  # fmt: skip
    p.add_argument("--deep", action="store_true", help="also read every chunk and compare "
                   "its CRC32C (reads all of Tier 2)")  # fmt: skip
    p.add_argument("--repair", action="store_true", help="fix what can be fixed safely "
                   "(a running daemon: only what it would fix itself)")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="one JSON object per finding, then a summary")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="override node.data_dir")
    p = add("pipeline", _cmd_pipeline, "run a Spark job over the mounted segments (local Spark)")
    p.add_argument("action", choices=["run"])
    p.add_argument("job", metavar="JOB", help="a module of pipeline.jobs, e.g. events_per_minute")
    p.add_argument("--mount", required=True, metavar="DIR", help="the gateway's mountpoint")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--stream", default="", help="directory under the mount (default: all)")
    p.add_argument("--cores", type=_integer(1, 4096), default=2,
                   help="local Spark cores (default 2)")  # fmt: skip
    p.add_argument("--streaming", action="store_true",
                   help="run as a Structured Streaming query over the streaming segments "
                   "source (docs/PIPELINE.md)")  # fmt: skip
    p.add_argument("--checkpoint", default="", metavar="DIR",
                   help="with --streaming: the query's checkpoint "
                   "(default OUT.checkpoint)")  # fmt: skip
    p.add_argument("--trigger", type=_seconds(0, 86400), default=10.0, metavar="SECONDS",
                   help="with --streaming: seconds between micro-batches (default 10)")  # fmt: skip
    p.add_argument("--available-now", action="store_true",
                   help="with --streaming: read what is there now, then stop")  # fmt: skip
    p = add("serve", _cmd_serve, "run the daemon in the foreground")
    p.add_argument("--listen", metavar="HOST:PORT", help="override server.listen (port 0: any)")
    p.add_argument("--data-dir", metavar="DIR", help="override node.data_dir")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help='override metrics.listen ("" = no metrics endpoint)')  # fmt: skip
    p.add_argument("--mountpoint", metavar="DIR",
                   help='override fuse.mountpoint ("" = no mount)')  # fmt: skip
    p.add_argument("--ready-file", metavar="FILE", help="write HOST:PORT here once serving")
    p.add_argument("--recover-from-tier2", action="store_true",
                   help="disaster recovery: rebuild this node's metadata from its newest "
                   "snapshot and newer chunks in Tier 2 first (the journal directory must "
                   "be empty)")  # fmt: skip
    p = add("export-metadata", _cmd_export_metadata,
            "write the metadata snapshot (segments, chunk lists, attributes)",
            client=True)  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE|s3://BUCKET/KEY|-",
                   help="where to write it (a file is replaced atomically)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="the JSON view instead of protobuf")
    p.add_argument("--offline", action="store_true",
                   help="read a stopped node's journal instead of asking the daemon")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="with --offline: override node.data_dir")
    p = add("import-metadata", _cmd_import_metadata,
            "give an empty node the metadata of an export (or rebuilt from Tier 2)")  # fmt: skip
    p.add_argument("source", nargs="?", metavar="FILE|s3://BUCKET/KEY|-",
                   help="an export-metadata file (protobuf or JSON)")  # fmt: skip
    p.add_argument("--from-tier2", action="store_true",
                   help="rebuild from the newest snapshot and newer chunks in Tier 2 "
                   "(what serve --recover-from-tier2 does), without serving")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="override node.data_dir")

    p = add("create", _cmd_create, "create a segment", client=True)
    p.add_argument("segment")
    p.add_argument("--codec", choices=["raw", "lines", "framed"], default="raw",
                   help="how its events end (docs/FORMATS.md): lines makes the mount show an "
                   "active segment ending at its last newline; framed refuses raw appends "
                   "that are not whole frames (default raw)")  # fmt: skip
    p = add("append", _cmd_append, "append events from stdin (one per line)", client=True)
    p.add_argument("segment")
    p.add_argument("--file", help="read this file instead of stdin")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--framed", action="store_true",
                     help="write each line as a framed event (length + payload)")  # fmt: skip
    fmt.add_argument("--raw", action="store_true", help="append the input bytes as they are "
                     "(each read of up to 4 MiB is one event)")  # fmt: skip
    p.add_argument("--create", action="store_true",
                   help="create the segment if missing, with the codec of the input "
                   "(lines, framed or raw)")  # fmt: skip
    p.add_argument("--timeout", type=_seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="give up (exit 25) once the daemon has been unreachable or "
                   "overloaded this long (default 60)")  # fmt: skip
    p.add_argument("--writer-id", metavar="UUID", type=_uuid,
                   help="continue an exactly-once writer (default: a new one)")  # fmt: skip
    p = add("cat", _cmd_cat, "write a segment's bytes to stdout", client=True)
    p.add_argument("segment")
    p.add_argument("--offset", type=_integer(0, MAX_OFFSET),
                   help="start here (default: the segment's start offset)")  # fmt: skip
    p.add_argument("-f", "--follow", action="store_true",
                   help="wait for appends like tail -f, until the segment is sealed")  # fmt: skip
    p = add("ls", _cmd_ls, "list segments", client=True)
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("-l", "--long", action="store_true", help="length, events, state, mtime")
    p.add_argument("--json", action="store_true", help="one JSON object per segment")
    p = add("stat", _cmd_stat, "print a segment's metadata as JSON", client=True)
    p.add_argument("segment")
    p = add("attrs", _cmd_attrs, "list a segment's attributes in id order", client=True)
    p.add_argument("segment")
    p.add_argument("--from", dest="start", type=_attribute_id, metavar="ID",
                   help="start at this id (32 hex digits; default: the lowest)")  # fmt: skip
    p.add_argument("--limit", type=_integer(0, MAX_OFFSET), default=0, metavar="N",
                   help="at most N attributes (default: all)")  # fmt: skip
    p = add("seal", _cmd_seal, "seal a segment (no more appends)", client=True)
    p.add_argument("segment")
    p = add("flush", _cmd_flush, "flush to Tier 2 now and wait until it is there", client=True)
    p.add_argument("segment", nargs="?", default="", help="one segment (default: all)")
    p.add_argument("--timeout", type=_seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="wait this long at most, while the daemon retries what fails (an "
                   "embedded S3 server restarting), then exit 27 saying what was left "
                   "(default 60)")  # fmt: skip
    p = add("truncate", _cmd_truncate, "drop the bytes below OFFSET", client=True)
    p.add_argument("segment")
    p.add_argument("offset", type=_integer(0, MAX_OFFSET))
    p = add("delete", _cmd_delete, "delete a segment", client=True)
    p.add_argument("segment")
    p = add("cluster", _cmd_cluster, "list the nodes sharing this node's Tier 2: state, "
            "segments, unflushed bytes, heartbeat age (exit 1 if one is down)",
            client=True)  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per node")
    p = add("stream", _cmd_stream, "create, change, show, roll or delete a stream (a directory "
            "of segments that rolls and expires)", client=True)  # fmt: skip
    p.add_argument("action", choices=["create", "set", "show", "list", "roll", "delete"])
    p.add_argument("name", nargs="?", default="", metavar="NAME")
    p.add_argument("--roll-size", metavar="SIZE", type=_policy_option("roll_size"),
                   help="seal the current segment at this size, e.g. 64MiB (0: never; "
                   "default: follow [streams])")  # fmt: skip
    p.add_argument("--roll-age", metavar="DURATION", type=_policy_option("roll_age_ms"),
                   help="... or when its first byte is this old, e.g. 1h")  # fmt: skip
    p.add_argument("--retain-size", metavar="SIZE", type=_policy_option("retain_size"),
                   help="delete the oldest data while the newer bytes alone are at least "
                   "this many (0: keep all)")  # fmt: skip
    p.add_argument("--retain-age", metavar="DURATION", type=_policy_option("retain_age_ms"),
                   help="delete sealed segments last changed longer ago than this, e.g. 7d "
                   "(0: keep all)")  # fmt: skip
    p.add_argument("--codec", choices=["raw", "lines", "framed"], help="create: the codec "
                   "every segment of the stream is created with, as `create --codec` "
                   "(docs/FORMATS.md; default raw)")  # fmt: skip
    p = add("txn", _cmd_txn, "transactions: begin (prints the name), append (stdin, like "
            "append), commit, abort", client=True)  # fmt: skip
    p.add_argument("action", choices=["begin", "append", "commit", "abort"])
    p.add_argument("name", metavar="NAME", help="begin: the parent segment or stream; "
                   "otherwise the transaction's name")  # fmt: skip
    p.add_argument("--txn-timeout", type=_seconds(0, MAX_TIMEOUT, zero=True), default=0.0,
                   metavar="SECONDS",
                   help="begin: abort unless committed within this long (default: "
                   "streams.txn_timeout)")  # fmt: skip
    p.add_argument("--file", help="append: read this file instead of stdin")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--framed", action="store_true", help="append: framed events")
    fmt.add_argument("--raw", action="store_true", help="append: the input bytes as they are")
    p.add_argument("--timeout", type=_seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="append: give up once the daemon is unreachable this long")  # fmt: skip
    p.add_argument("--writer-id", metavar="UUID", type=_uuid,
                   help="append: continue an exactly-once writer")  # fmt: skip
    return parser


#: Commands that create files under node.data_dir (or the Tier-2 directory).
_WRITES_NODE_FILES: frozenset[Command] = frozenset({_cmd_serve, _cmd_fsck, _cmd_import_metadata})


def _private_umask() -> None:
    """Make every file this process creates private to its user (0700 / 0600).

    The journal, the cache and the embedded S3 data hold segment bytes, and
    RocksDB and SeaweedFS (a child, which inherits the umask) create their
    files with the usual 0755 / 0644 minus the umask: outside systemd that
    is 022, which leaves them readable by every local user. Only bits are
    added, so a stricter umask stays.
    """
    os.umask(os.umask(0o077) | 0o077)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_wire_text(parser, args)
    except SystemExit as e:  # --help, or a usage error (printed: one line)
        return e.code if isinstance(e.code, int) else 2
    # Client commands print their own results; the library's progress notes
    # (a writer reconnecting) are for -v.
    quiet = args.func is not _cmd_serve
    logs.setup(logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO)
    if args.func in _WRITES_NODE_FILES:
        _private_umask()
    try:
        code: int = args.func(args)
    except GatewayError as e:
        print(f"segment-gateway: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
