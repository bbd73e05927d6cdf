"""The ``segment-gateway`` program: the parser assembled from the command modules, and `main`.

Each command module adds its verbs beside their handlers (``register``);
this module only lists the modules, in the order ``--help`` shows them, and
runs the chosen handler: a `GatewayError` ends the command with its one-line
message on stderr and its exit code, never a traceback (docs/OPERATIONS.md
lists the codes).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from gateway import logs
from gateway.cli import admin, cluster, segments, streams
from gateway.cli.values import check_wire_text
from gateway.config import DEFAULT_CONFIG_PATH
from gateway.errors import GatewayError

#: The command modules, in the order ``--help`` lists their verbs.
COMMAND_MODULES = (admin, segments, cluster, streams)


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only: a path or an option is never cut at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error (and whose
    help is wrapped by `_Formatter`; the commands' parsers are of this class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sub = self.prog.removeprefix("segment-gateway").strip()
        where = f"{sub}: " if sub else ""
        self.exit(2, f"segment-gateway: {where}{message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so docs and tests can inspect it)."""
    parser = _Parser(
        prog="segment-gateway",
        description="Append-only segments: durable in a local journal, tiered to S3, "
        "readable as files through FUSE.",
        epilog="`segment-gateway COMMAND --help` shows a command's options; `man "
        "segment-gateway` all of them. Exit codes and the operator's guide: "
        "/usr/share/doc/segment-gateway/OPERATIONS.md (docs/OPERATIONS.md).",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"configuration file (default {DEFAULT_CONFIG_PATH} if it exists)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


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
        check_wire_text(parser, args)
    except SystemExit as e:  # --help, or a usage error (printed: one line)
        return e.code if isinstance(e.code, int) else 2
    # Client commands print their own results; the library's progress notes
    # (a writer reconnecting) are for -v.
    quiet = not args.cmd_logs_progress
    logs.setup(logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO)
    if args.cmd_writes_node_files:
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
