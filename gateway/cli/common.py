"""What the commands share: the configuration, the daemon connection and adding a command.

Each command module has a ``register(sub)`` that adds its verbs with
`add_command`, beside their handlers: a handler takes the parsed arguments
and returns an exit code. Commands that talk to a daemon take ``--connect
HOST:PORT`` (default: ``server.listen`` of the configuration), ``--token``
and the TLS flags (``--tls-ca FILE`` or ``--tls``; docs/SECURITY.md); they
are added here (``client=True``) and read by `connect_settings` and
`tls_options`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from gateway.cli.values import host_port
from gateway.config import DEFAULT_CONFIG_PATH, Config

#: A command's handler: the parsed arguments in, the exit code out.
Command = Callable[[argparse.Namespace], int]
#: The sub-parsers of the ``segment-gateway`` parser, that commands are added to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def load_config(args: argparse.Namespace, check_files: bool = True) -> Config:
    """The configuration: --config if given, else the default file if it exists."""
    if args.config:
        return Config.load(args.config, check_files=check_files)
    if DEFAULT_CONFIG_PATH.exists():
        return Config.load(DEFAULT_CONFIG_PATH, check_files=check_files)
    return Config()


def connect_settings(args: argparse.Namespace) -> tuple[str, str]:
    """The daemon's address and the token: the options, else the environment or configuration."""
    # A client needs listen and token only: not the daemon's TLS key, which
    # is rightly unreadable to the users who run these commands -- nor, for
    # the same reason (it holds the token), perhaps the default file itself.
    default_unreadable = not os.access(DEFAULT_CONFIG_PATH, os.R_OK)
    if not args.config and DEFAULT_CONFIG_PATH.exists() and default_unreadable:
        config = Config()
    else:
        config = load_config(args, check_files=False)
    address = args.connect or config.server.listen
    token = args.token or os.environ.get("SEGMENT_GATEWAY_TOKEN", "") or config.server.token
    return address, token


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """``open_client`` keywords for the TLS flags (none: plain TCP)."""
    ca = args.tls_ca or os.environ.get("SEGMENT_GATEWAY_TLS_CA", "")
    if not (ca or args.tls or args.tls_cert or args.tls_key):
        return {}
    from gateway.client.client import client_ssl_context

    context = client_ssl_context(
        ca or None, cert_file=args.tls_cert or None, key_file=args.tls_key or None
    )
    return {"ssl_context": context, "server_hostname": args.tls_server_name}


def run_client(args: argparse.Namespace, fn: Callable[[Any], Awaitable[int]]) -> int:
    """Run ``fn(client)`` with a client connected as the options say; its exit code."""
    import trio

    from gateway.client.client import open_client

    address, token = connect_settings(args)
    tls = tls_options(args)

    async def main() -> int:
        async with open_client(address, token, **tls) as client:
            return await fn(client)

    return trio.run(main)


def info_dict(info: Any) -> dict[str, Any]:
    """A result dataclass (`SegmentInfo`, ...) as a JSON-ready dict."""
    return dataclasses.asdict(info)


def override_config(config: Config, overrides: dict[str, dict[str, Any]]) -> Config:
    """A copy of ``config`` with some keys replaced (validated like the file)."""
    doc: dict[str, dict[str, Any]] = {
        f.name: dataclasses.asdict(getattr(config, f.name)) for f in dataclasses.fields(config)
    }
    for section, values in overrides.items():
        doc[section].update(values)
    return Config.from_dict(doc, source="command line")


def node_config(args: argparse.Namespace, check_files: bool = True) -> Config:
    """The configuration with ``--data-dir`` applied (commands that act on a node's files)."""
    config = load_config(args, check_files=check_files)
    if args.data_dir:
        data_dir = str(pathlib.Path(args.data_dir).resolve())
        config = override_config(config, {"node": {"data_dir": data_dir}})
    return config


def add_command(
    sub: Commands,
    name: str,
    func: Command,
    help: str,
    client: bool = False,
    writes_node_files: bool = False,
    logs_progress: bool = False,
    progress: bool = False,
) -> argparse.ArgumentParser:
    """Add the verb ``name``, run by ``func``; its parser, for the verb's own arguments.

    ``client``: it talks to a daemon (the connection and TLS options).
    ``writes_node_files``: it creates files under node.data_dir or the Tier-2
    directory, which must be private to the user (`gateway.cli.program`).
    ``logs_progress``: the library's INFO log lines are shown (the daemon's);
    other commands print their own results and leave those to -v.
    ``progress``: it may take long and shows progress on a terminal
    (`gateway.progress`), which ``-q/--quiet`` turns off.
    """
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(
        func=func, cmd_writes_node_files=writes_node_files, cmd_logs_progress=logs_progress
    )
    if progress:
        p.add_argument("-q", "--quiet", action="store_true",
                       help="no progress bar on stderr (none is drawn when stderr is not a "
                       "terminal)")  # fmt: skip
    if client:
        p.add_argument("--connect", metavar="HOST:PORT", type=host_port, help="daemon address "
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
