"""The ``segment-gateway`` command.

Each subcommand is a function taking the parsed arguments and returning an
exit code. A `GatewayError` ends the command with its one-line message on
stderr and its exit code, never a traceback (docs/OPERATIONS.md lists the
codes).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Callable, Sequence

from gateway import __version__
from gateway.config import DEFAULT_CONFIG_PATH, Config
from gateway.errors import GatewayError


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"segment-gateway {__version__}")
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = Config.load(args.config_file or args.config)
    path = args.config_file or args.config
    print(f"{path}: ok (node {config.node.id}, journal {config.journal_dir})")
    return 0


def _cmd_journal_dump(args: argparse.Namespace) -> int:
    from gateway.journal.dump import dump

    directory = pathlib.Path(args.directory)
    if not directory.is_dir():
        print(f"segment-gateway: {directory}: not a directory", file=sys.stderr)
        return 2
    return dump(directory, sys.stdout, as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so docs and tests can inspect it)."""
    parser = argparse.ArgumentParser(
        prog="segment-gateway",
        description="Append-only segments: durable in a local journal, tiered to S3, "
        "readable as files through FUSE.",
    )
    parser.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG_PATH),
        metavar="FILE",
        help=f"configuration file (default {DEFAULT_CONFIG_PATH})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    add("version", _cmd_version, "print the version")
    p = add("check-config", _cmd_check_config, "validate a configuration file (exit 0 or 2)")
    p.add_argument(
        "config_file", nargs="?", metavar="FILE", help="file to check (default: --config)"
    )
    p = add("journal-dump", _cmd_journal_dump, "print a journal's frames and whether it is intact")
    p.add_argument("directory", metavar="DIR", help="journal directory (<data_dir>/journal)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except GatewayError as e:
        print(f"segment-gateway: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
