"""Commands that run or inspect a node: ``version``, ``check-config``, ``journal-dump``,
``fsck``, ``pipeline``, ``serve``, ``status``, ``export-metadata`` and ``import-metadata``.

Each imports what it runs (the daemon, fsck, Spark) only when it runs, so
that the other commands start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway import __version__, logs
from gateway.cli.common import (
    Commands,
    add_command,
    connect_settings,
    load_config,
    node_config,
    override_config,
    run_client,
    tls_options,
)
from gateway.cli.values import integer, seconds
from gateway.config import DEFAULT_CONFIG_PATH, Config
from gateway.errors import GatewayError
from gateway.progress import Progress, keep_drawing, shown

T = TypeVar("T")


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"segment-gateway {__version__}")
    return 0


def _add_version(sub: Commands) -> None:
    add_command(sub, "version", _cmd_version, "print the version")


def _cmd_check_config(args: argparse.Namespace) -> int:
    path = args.config_file or args.config or str(DEFAULT_CONFIG_PATH)
    config = Config.load(path)
    print(f"{path}: ok (node {config.node.id}, journal {config.journal_dir})")
    return 0


def _add_check_config(sub: Commands) -> None:
    p = add_command(sub, "check-config", _cmd_check_config,
                    "validate a configuration file (exit 0 or 2)")  # fmt: skip
    p.add_argument("config_file", nargs="?", metavar="FILE", help="default: --config")


def _cmd_journal_dump(args: argparse.Namespace) -> int:
    from gateway.journal.dump import dump

    directory = pathlib.Path(args.directory)
    if not directory.is_dir():
        print(f"segment-gateway: {directory}: not a directory", file=sys.stderr)
        return 2
    return dump(directory, sys.stdout, as_json=args.json)


def _add_journal_dump(sub: Commands) -> None:
    p = add_command(sub, "journal-dump", _cmd_journal_dump,
                    "print a journal's frames and whether it is intact")  # fmt: skip
    p.add_argument("directory", metavar="DIR", help="journal directory (<data_dir>/journal)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def _cmd_fsck(args: argparse.Namespace) -> int:
    from gateway.fsck import Options, fsck

    # As for client commands, the daemon's TLS files are not needed here.
    config = load_config(args, check_files=False)
    if args.data_dir:
        data_dir = str(pathlib.Path(args.data_dir).resolve())
        config = override_config(config, {"node": {"data_dir": data_dir}})
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
            tls=tls_options(args),
            node_dirs_named=bool(args.data_dir or args.config or DEFAULT_CONFIG_PATH.exists()),
            quiet=args.quiet,
        )
    except GatewayError as e:
        if e.exit_code > 1:
            raise
        # Exit 1 means "repaired" for fsck: an error must not read as that.
        print(f"segment-gateway: {e}", file=sys.stderr)
        return 2


def _add_fsck(sub: Commands) -> None:
    p = add_command(sub, "fsck", _cmd_fsck, "check the journal, metadata, Tier-2 chunks and "
                    "cache (exit 0 clean, 1 repaired, 2 problems left)", client=True,
                    writes_node_files=True, progress=True)  # fmt: skip
    p.add_argument("--deep", action="store_true", help="also read every chunk and compare "
                   "its CRC32C (reads all of Tier 2)")  # fmt: skip
    p.add_argument("--repair", action="store_true", help="fix what can be fixed safely "
                   "(a running daemon: only what it would fix itself)")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="one JSON object per finding, then a summary")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="override node.data_dir")


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


def _add_pipeline(sub: Commands) -> None:
    p = add_command(sub, "pipeline", _cmd_pipeline,
                    "run a Spark job over the mounted segments (local Spark)")  # fmt: skip
    p.add_argument("action", choices=["run"], help="run JOB (the only action)")
    p.add_argument("job", metavar="JOB", help="a module of pipeline.jobs, e.g. events_per_minute")
    p.add_argument("--mount", required=True, metavar="DIR", help="the gateway's mountpoint")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--stream", default="", help="directory under the mount (default: all)")
    p.add_argument("--cores", type=integer(1, 4096), default=2,
                   help="local Spark cores (default 2)")  # fmt: skip
    p.add_argument("--streaming", action="store_true",
                   help="run as a Structured Streaming query over the streaming segments "
                   "source (docs/PIPELINE.md)")  # fmt: skip
    p.add_argument("--checkpoint", default="", metavar="DIR",
                   help="with --streaming: the query's checkpoint "
                   "(default OUT.checkpoint)")  # fmt: skip
    p.add_argument("--trigger", type=seconds(0, 86400), default=10.0, metavar="SECONDS",
                   help="with --streaming: seconds between micro-batches (default 10)")  # fmt: skip
    p.add_argument("--available-now", action="store_true",
                   help="with --streaming: read what is there now, then stop")  # fmt: skip


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
    import trio

    from gateway.daemon import run_daemon

    # Paths are resolved once, now: resolving the mountpoint again while it
    # is mounted (at SIGHUP) would stat the mount from the event loop that
    # serves it, and wait for itself forever.
    overrides = _serve_overrides(args)

    def load() -> Config:
        """The configuration file with the command line's overrides (again at SIGHUP)."""
        config = load_config(args)
        return override_config(config, overrides) if overrides else config

    config = load()
    logs.REDACT.add(config.server.token)
    logging.getLogger().setLevel(config.logging.level.upper())
    ready = pathlib.Path(args.ready_file) if args.ready_file else None
    trio.run(run_daemon, config, ready, load, None, args.recover_from_tier2)
    return 0


def _add_serve(sub: Commands) -> None:
    p = add_command(sub, "serve", _cmd_serve, "run the daemon in the foreground",
                    writes_node_files=True, logs_progress=True)  # fmt: skip
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


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from gateway import summary

    async def run(client: Any) -> int:
        s = await client.status()
        rows = summary.rows(s)
        if args.json:
            print(json.dumps(summary.as_dict(s)))
        else:
            width = max(len(r.label) for r in rows)
            for r in rows:
                print(f"{'!' if r.attention else ' '} {r.label:<{width}}  {r.text}")
        return 1 if any(r.attention for r in rows) else 0

    return run_client(args, run)


def _add_status(sub: Commands) -> None:
    p = add_command(sub, "status", _cmd_status, "show the daemon's node at a glance: version, "
                    "uptime, journal, cache, Tier-2 backlog, mount, embedded S3 (exit 1 when a "
                    "line is marked !)", client=True)  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object, every field by name")


def _cmd_export_metadata(args: argparse.Namespace) -> int:
    import trio

    from gateway.recovery import metadata_io

    if args.offline:
        config = node_config(args, check_files=False)
    else:
        unreadable = not os.access(DEFAULT_CONFIG_PATH, os.R_OK)
        if not args.config and DEFAULT_CONFIG_PATH.exists() and unreadable:
            config = Config()  # as for every client command (see connect_settings)
        else:
            config = node_config(args, check_files=False)

    async def export(bar: Progress) -> Any:
        from gateway.summary import size

        if args.offline:
            bar.describe("export-metadata: replaying the journal")
            snapshot = await trio.to_thread.run_sync(metadata_io.export_offline, config)
        else:
            from gateway.client.client import open_client

            bar.describe("export-metadata: the daemon builds the snapshot")
            address, token = connect_settings(args)
            async with open_client(address, token, **tls_options(args)) as client:
                snapshot = await client.export_metadata()
        data = metadata_io.encode(snapshot, as_json=args.json)
        bar.describe(f"export-metadata: writing {size(len(data))} to {args.out}")
        await metadata_io.write_location(args.out, data, config)
        return snapshot

    snapshot = trio.run(with_progress, "export-metadata", args.quiet, export)
    segments = snapshot.container.segments
    chunks = sum(len(s.chunks) for s in segments)
    stored = sum(s.storage_length - s.start_offset for s in segments)
    print(
        f"exported node {snapshot.node!r} (epoch {snapshot.epoch}): {len(segments)} segment(s), "
        f"{chunks} chunk(s), {stored} byte(s) in Tier 2, to {args.out}",
        file=sys.stderr,
    )
    return 0


async def with_progress(what: str, quiet: bool, work: Callable[[Progress], Awaitable[T]]) -> T:
    """``work(bar)``, with a bar that it labels with each step and that is redrawn
    meanwhile (its time moves on while the work is one long call)."""
    from gateway.aio import service_nursery

    with Progress(what, unit="", show=shown(quiet)) as bar:
        async with service_nursery() as nursery:  # the work's errors as they are
            if bar.drawn:
                nursery.start_soon(keep_drawing, bar)
            result = await work(bar)
            nursery.cancel_scope.cancel()
    return result


def _add_export_metadata(sub: Commands) -> None:
    p = add_command(sub, "export-metadata", _cmd_export_metadata,
                    "write the metadata snapshot (segments, chunk lists, attributes)",
                    client=True, progress=True)  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE|s3://BUCKET/KEY|-",
                   help="where to write it (a file is replaced atomically)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="the JSON view instead of protobuf")
    p.add_argument("--offline", action="store_true",
                   help="read a stopped node's journal instead of asking the daemon")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="with --offline: override node.data_dir")


def _cmd_import_metadata(args: argparse.Namespace) -> int:
    from gateway.recovery import metadata_io

    config = node_config(args)
    if args.from_tier2 == bool(args.source):
        print("segment-gateway: import-metadata takes a SOURCE or --from-tier2", file=sys.stderr)
        return 2

    async def run(bar: Progress) -> Any:
        if args.from_tier2:
            bar.describe("import-metadata: rebuilding from Tier 2")
            return await metadata_io.recover_from_tier2(config, False)
        bar.describe(f"import-metadata: reading {args.source}")
        data = await metadata_io.read_location(args.source, config)
        snapshot = metadata_io.decode(data, args.source)
        bar.describe(
            f"import-metadata: checking {len(snapshot.container.segments)} segment(s) "
            "against Tier 2 and installing them"
        )
        return await metadata_io.import_metadata(config, snapshot, args.source, False)

    import trio

    report = trio.run(with_progress, "import-metadata", args.quiet, run)
    for line in report.summary():
        print(line)
    print(
        f"imported {report.segments} segment(s), {report.stored_bytes} byte(s) in Tier 2, "
        f"into {config.journal_dir}; `serve` starts from them"
    )
    return 0


def _add_import_metadata(sub: Commands) -> None:
    p = add_command(sub, "import-metadata", _cmd_import_metadata,
                    "give an empty node the metadata of an export (or rebuilt from Tier 2)",
                    writes_node_files=True, progress=True)  # fmt: skip
    p.add_argument("source", nargs="?", metavar="FILE|s3://BUCKET/KEY|-",
                   help="an export-metadata file (protobuf or JSON)")  # fmt: skip
    p.add_argument("--from-tier2", action="store_true",
                   help="rebuild from the newest snapshot and newer chunks in Tier 2 "
                   "(what serve --recover-from-tier2 does), without serving")  # fmt: skip
    p.add_argument("--data-dir", metavar="DIR", help="override node.data_dir")


def register(sub: Commands) -> None:
    """Add this module's commands (in the order ``--help`` lists them)."""
    for add in (
        _add_version,
        _add_check_config,
        _add_journal_dump,
        _add_fsck,
        _add_pipeline,
        _add_serve,
        _add_status,
        _add_export_metadata,
        _add_import_metadata,
    ):
        add(sub)
