"""Commands on streams and transactions: ``stream`` (create, set, show, list, roll,
delete) and ``txn`` (begin, append, commit, abort)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from gateway.cli.append import cmd_append
from gateway.cli.common import Commands, add_command, run_client
from gateway.cli.values import MAX_TIMEOUT, policy_option, seconds, writer_uuid
from gateway.errors import BadRequest

#: ``stream`` options -> their policy field (``StreamPolicy``).
_STREAM_OPTIONS = {
    "roll_size": "roll_size",
    "roll_age": "roll_age_ms",
    "retain_size": "retain_size",
    "retain_age": "retain_age_ms",
}


def _stream_policy(args: argparse.Namespace) -> dict[str, int | None]:
    """The policy options given: a value (`policy_option`), or None for "default"."""
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

    return run_client(args, run)


def _add_stream(sub: Commands) -> None:
    p = add_command(sub, "stream", _cmd_stream, "create, change, show, roll or delete a stream "
                    "(a directory of segments that rolls and expires)", client=True)  # fmt: skip
    p.add_argument("action", choices=["create", "set", "show", "list", "roll", "delete"],
                   help="what to do (list: every stream; the others: the stream NAME)")  # fmt: skip
    p.add_argument("name", nargs="?", default="", metavar="NAME", help="the stream's name")
    p.add_argument("--roll-size", metavar="SIZE", type=policy_option("roll_size"),
                   help="seal the current segment at this size, e.g. 64MiB (0: never; "
                   "default: follow [streams])")  # fmt: skip
    p.add_argument("--roll-age", metavar="DURATION", type=policy_option("roll_age_ms"),
                   help="seal the current segment once its first byte is this old, e.g. 1h "
                   "(default: follow [streams])")  # fmt: skip
    p.add_argument("--retain-size", metavar="SIZE", type=policy_option("retain_size"),
                   help="delete the oldest data while the newer bytes alone are at least "
                   "this many (0: keep all)")  # fmt: skip
    p.add_argument("--retain-age", metavar="DURATION", type=policy_option("retain_age_ms"),
                   help="delete sealed segments last changed longer ago than this, e.g. 7d "
                   "(0: keep all)")  # fmt: skip
    p.add_argument("--codec", choices=["raw", "lines", "framed"], help="create: the codec "
                   "every segment of the stream is created with, as `create --codec` "
                   "(docs/FORMATS.md; default raw)")  # fmt: skip


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
        return cmd_append(args)

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

    return run_client(args, run)


def _add_txn(sub: Commands) -> None:
    p = add_command(sub, "txn", _cmd_txn, "transactions: begin (prints the name), append "
                    "(stdin, like append), commit, abort", client=True)  # fmt: skip
    p.add_argument("action", choices=["begin", "append", "commit", "abort"], help="what to do")
    p.add_argument("name", metavar="NAME", help="begin: the parent segment or stream; "
                   "otherwise the transaction's name")  # fmt: skip
    p.add_argument("--txn-timeout", type=seconds(0, MAX_TIMEOUT, zero=True), default=0.0,
                   metavar="SECONDS",
                   help="begin: abort unless committed within this long (default: "
                   "streams.txn_timeout)")  # fmt: skip
    p.add_argument("--file", help="append: read this file instead of stdin")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--framed", action="store_true", help="append: framed events")
    fmt.add_argument("--raw", action="store_true", help="append: the input bytes as they are")
    p.add_argument("--timeout", type=seconds(0, MAX_TIMEOUT), default=60.0, metavar="SECONDS",
                   help="append: give up once the daemon is unreachable this long")  # fmt: skip
    p.add_argument("--writer-id", metavar="UUID", type=writer_uuid,
                   help="append: continue an exactly-once writer")  # fmt: skip


def register(sub: Commands) -> None:
    """Add this module's commands (in the order ``--help`` lists them)."""
    _add_stream(sub)
    _add_txn(sub)
