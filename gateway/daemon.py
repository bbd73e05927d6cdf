"""``segment-gateway serve``: the daemon's lifecycle.

Start: open Tier 2 (starting the embedded S3 server if configured), recover
the container from the journal, start the storage writer, mount the segments
at ``fuse.mountpoint`` (unless it is ""), then listen. Stop (SIGTERM or
SIGINT), in DESIGN.md's order: stop accepting connections, stop reading new
requests and answer the ones already in flight (bounded by
``shutdown_timeout``), unmount, then close the container (final checkpoint)
and the journal, and stop the storage writer (uploads in progress are
abandoned: their objects are garbage for GC) and the embedded S3 server.
Nothing acknowledged depends on the shutdown finishing: it is in the journal
already.
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import tempfile

import trio

from gateway.aio import service_nursery
from gateway.config import Config
from gateway.container import open_container
from gateway.server import Server
from gateway.tier2.bindings import open_tier2

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 10.0


def _write_ready_file(path: pathlib.Path, text: str) -> None:
    """Atomically publish ``text`` (the bound address) for scripts and tests."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


async def run_daemon(config: Config, ready_file: pathlib.Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down in order."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_tier2(config) as tier2, open_container(config, tier2) as container:
            server = Server(container, config.server, config.container.max_append_bytes)
            async with service_nursery() as nursery:
                if config.fuse.mountpoint:
                    from fs.mount import serve_mount  # pyfuse3 only when mounting

                    await nursery.start(serve_mount, container, config)
                addresses = await nursery.start(server.serve)
                host, port = addresses[0]
                log.info("ready: %d segment(s), listening on %s:%d",
                         container.segment_count, host, port)  # fmt: skip
                if ready_file is not None:
                    _write_ready_file(ready_file, f"{host}:{port}\n")
                async for signum in signals:
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    break
                server.stop_accepting()
                server.stop_reading()
                with trio.move_on_after(SHUTDOWN_TIMEOUT) as scope:
                    await server.wait_connections_closed()
                if scope.cancelled_caught:
                    log.warning(
                        "%d connection(s) still busy after %.0fs; closing them",
                        len(server.connections),
                        SHUTDOWN_TIMEOUT,
                    )
                nursery.cancel_scope.cancel()
    log.info("stopped")
