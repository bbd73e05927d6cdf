"""Commands on segments: ``create``, ``cat``, ``ls``, ``stat``, ``attrs``, ``seal``,
``flush``, ``truncate`` and ``delete`` (``append`` has a module of its own).

Each is a request or a few to the daemon through the client library
(`run_client`), printed for a person or as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gateway.cli import append
from gateway.cli.common import (
    Commands,
    add_command,
    connect_settings,
    info_dict,
    run_client,
    tls_options,
)
from gateway.cli.values import MAX_OFFSET, MAX_TIMEOUT, attribute_id, integer, seconds
from gateway.errors import BadRequest, GatewayError, Unavailable
from gateway.progress import Progress, shown

#: What a segment argument is, in every command's help.
SEGMENT_HELP = "the segment's name (its path under the mount)"


def _cmd_create(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.create(args.segment, codec=args.codec)
        print(json.dumps(info_dict(info)))
        return 0

    return run_client(args, run)


def _add_create(sub: Commands) -> None:
    p = add_command(sub, "create", _cmd_create, "create a segment", client=True)
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)
    p.add_argument("--codec", choices=["raw", "lines", "framed"], default="raw",
                   help="how its events end (docs/FORMATS.md): lines makes the mount show an "
                   "active segment ending at its last newline; framed refuses raw appends "
                   "that are not whole frames (default raw)")  # fmt: skip


def _cmd_cat(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    # Progress only when the bytes go elsewhere than the terminal it is drawn on.
    show = shown(args.quiet) and not sys.stdout.isatty()

    async def run(client: Any) -> int:
        offset = args.offset
        info = None
        if offset is None or show:
            info = await client.info(args.segment)
            offset = info.start_offset if offset is None else offset
        total = None if args.follow or info is None else max(0, info.length - offset)
        with Progress(f"cat {args.segment}", total, show=show) as bar:
            while True:
                got = 0
                end = False
                async for piece in client.read_pieces(
                    args.segment, offset, 8 << 20, wait=1.0 if args.follow else 0.0
                ):
                    out.write(piece.data)
                    got += len(piece.data)
                    bar.advance(len(piece.data))
                    end = piece.end_of_segment or (
                        not args.follow and piece.offset + len(piece.data) >= piece.length
                    )
                out.flush()
                offset += got
                if end:
                    return 0

    return run_client(args, run)


def _add_cat(sub: Commands) -> None:
    p = add_command(sub, "cat", _cmd_cat, "write a segment's bytes to stdout", client=True,
                    progress=True)  # fmt: skip
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)
    p.add_argument("--offset", type=integer(0, MAX_OFFSET),
                   help="start here (default: the segment's start offset)")  # fmt: skip
    p.add_argument("-f", "--follow", action="store_true",
                   help="wait for appends like tail -f, until the segment is sealed")  # fmt: skip


def _cmd_ls(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        infos = await client.list(args.prefix)
        if args.json:
            for i in infos:
                print(json.dumps(info_dict(i)))
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

    return run_client(args, run)


def _add_ls(sub: Commands) -> None:
    p = add_command(sub, "ls", _cmd_ls, "list segments", client=True)
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX",
                   help="only names starting with this (default: every segment)")  # fmt: skip
    p.add_argument("-l", "--long", action="store_true", help="length, events, state, mtime")
    p.add_argument("--json", action="store_true", help="one JSON object per segment")


def _cmd_stat(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.info(args.segment)
        attrs, more = await client.attribute_range(args.segment, b"", STAT_ATTRIBUTES)
        doc = info_dict(info)
        if info.event_count < 0:
            doc["event_count"] = None  # cut to what its down owner flushed: not known
        doc["attributes"] = {k.hex(): v for k, v in attrs}
        if more:
            # A segment may have millions (one per exactly-once writer).
            doc["attributes_more_from"] = more.hex()
        print(json.dumps(doc, indent=2))
        return 0

    return run_client(args, run)


def _add_stat(sub: Commands) -> None:
    p = add_command(sub, "stat", _cmd_stat, "print a segment's metadata as JSON", client=True)
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)


#: Attributes `stat` shows; `attrs` pages through all of them.
STAT_ATTRIBUTES = 100


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

    return run_client(args, run)


def _add_attrs(sub: Commands) -> None:
    p = add_command(sub, "attrs", _cmd_attrs, "list a segment's attributes in id order",
                    client=True)  # fmt: skip
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)
    p.add_argument("--from", dest="start", type=attribute_id, metavar="ID",
                   help="start at this id (32 hex digits; default: the lowest)")  # fmt: skip
    p.add_argument("--limit", type=integer(0, MAX_OFFSET), default=0, metavar="N",
                   help="at most N attributes (default: all)")  # fmt: skip


def _cmd_seal(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.seal(args.segment)
        print(f"sealed {info.name} at length {info.length}")
        return 0

    return run_client(args, run)


def _add_seal(sub: Commands) -> None:
    p = add_command(sub, "seal", _cmd_seal, "seal a segment (no more appends)", client=True)
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)


def _cmd_flush(args: argparse.Namespace) -> int:
    import trio

    from gateway.aio import service_nursery

    what = args.segment or "every segment"

    async def run(client: Any) -> int:
        # The daemon waits (retrying) up to --timeout and then says what was
        # left; a little longer here, for a daemon that does not answer.
        with (
            Progress(f"flush {what}", show=shown(args.quiet)) as bar,
            trio.move_on_after(args.timeout + FLUSH_ANSWER_GRACE),
        ):
            async with service_nursery() as nursery:  # the flush's errors as they are
                if bar.drawn:
                    nursery.start_soon(_watch_flush, args, bar)
                await client.flush(args.segment, args.timeout)
                nursery.cancel_scope.cancel()
            bar.close()
            print(f"flushed {what} to Tier 2")
            return 0
        raise Unavailable(f"the daemon did not answer the flush within {args.timeout:g}s")

    return run_client(args, run)


async def _watch_flush(args: argparse.Namespace, bar: Progress) -> None:
    """Draw how much of what was unflushed at the start is in Tier 2 now.

    Asked on a connection of its own (one connection answers in request
    order: after the flush), every FLUSH_POLL_INTERVAL.
    """
    import trio

    from gateway.client.client import open_client

    address, token = connect_settings(args)
    try:
        async with open_client(address, token, **tls_options(args)) as client:
            if not args.segment and not client.serves("status"):
                return  # an older daemon: no total to draw against

            async def unflushed() -> int:
                if args.segment:
                    info = await client.info(args.segment)
                    return max(0, info.length - max(info.storage_length, info.start_offset))
                return int((await client.status()).tier2_unflushed_bytes)

            total = await unflushed()
            bar.set_total(total)
            while True:
                await trio.sleep(FLUSH_POLL_INTERVAL)
                bar.reach(max(0, total - await unflushed()))
    except (GatewayError, OSError):
        return  # only the drawing stops: the flush answers for itself


def _add_flush(sub: Commands) -> None:
    p = add_command(sub, "flush", _cmd_flush, "flush to Tier 2 now and wait until it is there",
                    client=True, progress=True)  # fmt: skip
    p.add_argument("segment", nargs="?", default="", metavar="SEGMENT",
                   help="one segment (default: every segment)")  # fmt: skip
    p.add_argument("--timeout", type=seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="wait this long at most, while the daemon retries what fails (an "
                   "embedded S3 server restarting), then exit 27 saying what was left "
                   "(default 60)")  # fmt: skip


#: How long `flush` waits for the daemon's answer beyond its --timeout.
FLUSH_ANSWER_GRACE = 10.0
#: Seconds between two looks at what is left, while `flush` draws its progress.
FLUSH_POLL_INTERVAL = 0.5


def _cmd_truncate(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        info = await client.truncate(args.segment, args.offset)
        print(f"truncated {info.name}: bytes below {info.start_offset} dropped")
        return 0

    return run_client(args, run)


def _add_truncate(sub: Commands) -> None:
    p = add_command(sub, "truncate", _cmd_truncate, "drop the bytes below OFFSET", client=True)
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)
    p.add_argument("offset", type=integer(0, MAX_OFFSET), metavar="OFFSET",
                   help="the new start offset (bytes below it read as zeros)")  # fmt: skip


def _cmd_delete(args: argparse.Namespace) -> int:
    async def run(client: Any) -> int:
        await client.delete(args.segment)
        print(f"deleted {args.segment}")
        return 0

    return run_client(args, run)


def _add_delete(sub: Commands) -> None:
    p = add_command(sub, "delete", _cmd_delete, "delete a segment", client=True)
    p.add_argument("segment", metavar="SEGMENT", help=SEGMENT_HELP)


def register(sub: Commands) -> None:
    """Add this module's commands (in the order ``--help`` lists them)."""
    _add_create(sub)
    append.register(sub)  # beside create in --help, as it always was
    for add in (_add_cat, _add_ls, _add_stat, _add_attrs, _add_seal, _add_flush, _add_truncate,
                _add_delete):  # fmt: skip
        add(sub)
