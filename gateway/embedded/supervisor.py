"""Keeping the embedded server up: restarts after an exit nobody asked for.

`run_embedded_s3` starts the child and supervises it: an exit it did not ask
for is noticed at once (a pidfd), logged at ERROR with the end of weed's log,
and answered by restarts with capped exponential backoff on the same ports
and data. Meanwhile `EmbeddedS3.check_available` raises `EmbeddedS3Down`,
which the chunk layer uses to fail Tier-2 calls at once instead of retrying
them against a dead server.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from gateway.aio import service_nursery
from gateway.embedded.errors import EmbeddedS3Error
from gateway.embedded.files import explain
from gateway.embedded.process import EmbeddedS3, State

__all__ = [
    "RESTART_FIRST_DELAY",
    "RESTART_MAX_DELAY",
    "RESTART_STABLE_AFTER",
    "describe_exit",
    "run_embedded_s3",
    "supervise",
]

log = logging.getLogger(__name__)

#: First wait before restarting a server that exited; doubles per quick failure.
RESTART_FIRST_DELAY = 0.5
#: Longest wait between restart attempts.
RESTART_MAX_DELAY = 30.0
#: A server up this long counts as healthy: its next exit restarts after the first delay.
RESTART_STABLE_AFTER = 60.0


def describe_exit(status: int) -> str:
    """``exit status 2`` or ``killed by SIGKILL``, for a `subprocess.Popen.returncode`."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


def _state(server: EmbeddedS3) -> State:
    # A call, not an attribute: mypy would keep an attribute narrowed across awaits.
    return server.state


async def supervise(
    server: EmbeddedS3,
    *,
    startup_timeout: float = 60.0,
    first_delay: float = RESTART_FIRST_DELAY,
    max_delay: float = RESTART_MAX_DELAY,
    stable_after: float = RESTART_STABLE_AFTER,
) -> None:
    """Restart ``server`` whenever it exits, until cancelled; call once it is up.

    Each exit is logged at ERROR with the end of weed's log, each restart
    attempt at WARNING. The wait before an attempt starts at ``first_delay``
    and doubles up to ``max_delay`` while attempts fail or the server keeps
    dying within ``stable_after`` s of starting. Runs in the trio thread, so
    restarted processes die with the daemon too.
    """
    delay = first_delay
    while True:
        process = server.process
        if process is None or _state(server) != "up":
            raise EmbeddedS3Error("supervise() needs a server that is up")
        status = await server.wait_exited()
        if _state(server) == "stopped" or server.process is not process:
            return  # stopped on purpose meanwhile
        up_for = server.record_exit(status)
        if up_for >= stable_after:
            delay = first_delay
        log.error(
            "embedded S3 server (SeaweedFS, pid %d) exited (%s) after %.1f s up; "
            "Tier-2 calls fail until it is back. Its log: %s",
            process.pid,
            describe_exit(status),
            up_for,
            explain(server.log_path),
        )
        down_since = time.monotonic()
        attempt = 0
        while _state(server) != "up":
            attempt += 1
            log.warning("embedded S3 server: restarting it (attempt %d) in %.1f s", attempt, delay)
            await trio.sleep(delay)
            delay = min(max_delay, delay * 2)
            server.record_restart_attempt()
            try:
                await trio.to_thread.run_sync(lambda: server.prepare(same_ports=True))
                server.spawn(same_ports=True)
                await trio.to_thread.run_sync(
                    server.wait_ready, startup_timeout, abandon_on_cancel=True
                )
            except EmbeddedS3Error as e:
                server.kill()
                with contextlib.suppress(EmbeddedS3Error):  # prepare() tries again
                    await trio.to_thread.run_sync(server.reap)
                server.record_restart_failed()
                log.warning("embedded S3 server: restart attempt %d failed: %s", attempt, e)
                continue
            server.mark_up(restarted=True)
            log.warning(
                "embedded S3 server is up again (pid %s, restart %d) after %.1f s down",
                server.pid,
                server.statistics().restarts,
                time.monotonic() - down_since,
            )


@asynccontextmanager
async def run_embedded_s3(
    data_dir: pathlib.Path,
    port: int = 0,
    *,
    startup_timeout: float = 60.0,
    restart_first_delay: float = RESTART_FIRST_DELAY,
    restart_max_delay: float = RESTART_MAX_DELAY,
) -> AsyncIterator[EmbeddedS3]:
    """Run and supervise an `EmbeddedS3` for the duration of the block (the daemon's Tier 2).

    The process is started, and restarted after an exit nobody asked for
    (`supervise`), from the calling (trio) thread, so that it dies
    with the daemon even if the daemon is killed; waiting for it and stopping
    it happen in worker threads. Stopping is shielded from cancellation: the
    child must not outlive the block.
    """
    server = EmbeddedS3(data_dir, port)
    try:
        await trio.to_thread.run_sync(server.prepare)
        server.spawn()  # fork+exec: milliseconds; see the module docstring for the thread
        await trio.to_thread.run_sync(server.wait_ready, startup_timeout, abandon_on_cancel=True)
        server.mark_up()
        async with service_nursery() as nursery:
            nursery.start_soon(
                functools.partial(
                    supervise,
                    server,
                    startup_timeout=startup_timeout,
                    first_delay=restart_first_delay,
                    max_delay=restart_max_delay,
                )
            )
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            # Kill first, here: a wait_ready thread abandoned by a
            # cancellation then sees the process gone and ends.
            server.kill()
            await trio.to_thread.run_sync(server.stop)
