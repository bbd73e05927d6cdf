"""Transactions under faults, on real daemons: restarts, lost answers, deadlines, the CLI.

A transaction survives a daemon restart, so its commit must too: the
client library reconnects and retries it. A retried commit learns what
happened to the first try from the daemon's record of finished
transactions (journaled, so a restart keeps it): committed -- the same
answer again --, aborted, or timed out. The deadline holds to the
millisecond whatever ``streams.interval`` says, and the `txn` commands
refuse names that are not transactions.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.client.writer import open_transaction
from gateway.errors import GatewayError
from tests.helpers.daemon import Daemon
from tests.helpers.proxy import DroppingProxy
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

#: The timeout sweep runs once an hour: only the deadline check at commit can refuse.
CONFIG = """
[streams]
interval = "1h"
"""


def cli(daemon: Daemon, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--connect", daemon.address],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def events(first: int, last: int) -> list[bytes]:
    return [b"event-%05d" % i for i in range(first, last)]


def test_open_transaction_commits_after_the_daemon_is_killed_and_restarted(
    tmp_path: pathlib.Path,
) -> None:
    d = Daemon(tmp_path / "node", CONFIG)
    d.start()
    try:
        with SyncClient(d.address) as c:
            c.create("orders", codec="lines")
            c.append("orders", b"before\n")

        async def main() -> tuple[object, int]:
            async with (
                trio.open_nursery() as nursery,
                open_transaction(
                    d.address, "orders", codec="lines", txn_timeout=600, reconnect_timeout=90
                ) as txn,
            ):
                for e in events(0, 300):
                    await txn.write(e)
                await txn.writer.flush()  # these are stored in the transaction...
                await trio.to_thread.run_sync(d.kill)  # ...when the daemon dies
                for e in events(300, 600):
                    await txn.write(e)  # written while it is down
                await trio.to_thread.run_sync(d.start)
                await txn.writer.flush()
                # Down again as the block ends: the commit meets no daemon
                # and is sent again until the restarted one answers.
                await trio.to_thread.run_sync(d.kill)
                nursery.start_soon(trio.to_thread.run_sync, d.start)
            return txn.committed, txn.retries

        committed, retries = trio.run(main)
        assert retries >= 1  # the commit did meet a dead daemon
        body = b"".join(e + b"\n" for e in events(0, 600))
        with SyncClient(d.address) as c:
            assert c.read("orders", 0, 1 << 20).data == b"before\n" + body
            assert c.info("orders").event_count == 601
            assert c.list(".txn") == []
            # Committed once, where the block was told it landed.
            assert committed is not None
            assert (committed.segment, committed.offset, committed.length) == (  # type: ignore[attr-defined]
                "orders",
                7,
                len(body),
            )
            # A commit sent again, here and after another crash, answers the same.
            assert c.commit_transaction(committed.name) == committed  # type: ignore[attr-defined]
        d.kill()
        d.start()
        with SyncClient(d.address) as c:
            assert c.commit_transaction(committed.name) == committed  # type: ignore[attr-defined]
            assert c.read("orders", 0, 1 << 20).data == b"before\n" + body
    finally:
        d.kill()


def test_a_commit_whose_answer_was_lost_is_retried_and_answers_committed(
    tmp_path: pathlib.Path,
) -> None:
    d = Daemon(tmp_path / "node", CONFIG)
    d.start()
    try:
        with SyncClient(d.address) as c:
            c.create("p", codec="lines")

        async def main() -> tuple[object, int]:
            proxy = DroppingProxy(d.port)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(proxy.run)

                async def cut_once_committed() -> None:
                    # The daemon committed (the parent grew) but its answer
                    # went nowhere: the connection breaks now.
                    async with open_client(d.address) as direct:
                        # A read at the tail waits for the parent to grow.
                        while not (await direct.read("p", 0, 1, wait=5.0)).data:
                            pass
                    proxy.muted = False
                    proxy.drop_all()

                async with open_transaction(
                    f"127.0.0.1:{port}", "p", codec="lines", reconnect_timeout=60
                ) as txn:
                    for e in events(0, 200):
                        await txn.write(e)
                    await txn.writer.flush()
                    proxy.muted = True
                    nursery.start_soon(cut_once_committed)
                drops = proxy.drops
                nursery.cancel_scope.cancel()
            return txn.committed, drops

        committed, drops = trio.run(main)
        body = b"".join(e + b"\n" for e in events(0, 200))
        assert drops >= 1  # the commit's answer really was lost
        assert committed is not None
        assert (committed.segment, committed.offset, committed.length) == ("p", 0, len(body))  # type: ignore[attr-defined]
        with SyncClient(d.address) as c:
            assert c.read("p", 0, 1 << 20).data == body  # once, not twice
            assert c.info("p").event_count == 200
    finally:
        d.kill()


def test_a_commit_at_the_deadline_says_timed_out_before_the_sweep_runs(
    tmp_path: pathlib.Path,
) -> None:
    d = Daemon(tmp_path / "node", CONFIG)
    d.start()
    try:
        with SyncClient(d.address) as c:
            c.create("p")
            t = c.begin_transaction("p", txn_timeout=1.0)
            c.append(t.name, b"late")
            wait_for(
                lambda: time.time() * 1000 >= t.deadline_ms + 50, 30, "the transaction's deadline"
            )
            with pytest.raises(GatewayError, match="timed out") as e:
                c.commit_transaction(t.name)
            assert e.value.exit_code == 41
            assert c.info("p").length == 0
            # It was aborted by that commit: asking again says the same.
            with pytest.raises(GatewayError, match="timed out"):
                c.commit_transaction(t.name)
        r = cli(d, "txn", "commit", t.name)
        assert r.returncode == 41 and b"timed out" in r.stderr, r.stderr
        # The outcome is journaled: a crash does not turn it into "does not exist".
        d.kill()
        d.start()
        r = cli(d, "txn", "commit", t.name)
        assert r.returncode == 41 and b"timed out" in r.stderr, r.stderr
        with SyncClient(d.address) as c:
            assert c.info("p").length == 0
            # An aborted transaction's commit says so too.
            t2 = c.begin_transaction("p")
            c.append(t2.name, b"never")
            c.abort_transaction(t2.name)
            with pytest.raises(GatewayError, match="aborted") as e:
                c.commit_transaction(t2.name)
            assert e.value.exit_code == 42
            c.abort_transaction(t2.name)  # aborting twice is fine
            assert c.info("p").length == 0
    finally:
        d.kill()


def test_txn_commands_refuse_plain_segments_and_streams(tmp_path: pathlib.Path) -> None:
    d = Daemon(tmp_path / "node", CONFIG)
    d.start()
    try:
        assert cli(d, "create", "plain").returncode == 0
        assert cli(d, "stream", "create", "s").returncode == 0
        for name in ("plain", "s", "nothing-here"):
            for args, stdin in (
                (("txn", "append", name), b"a\nb\n"),
                (("txn", "commit", name), b""),
                (("txn", "abort", name), b""),
            ):
                r = cli(d, *args, stdin=stdin)
                assert r.returncode == 40, (args, r.returncode, r.stderr)
                assert f"{name!r} is not a transaction".encode() in r.stderr, r.stderr
        with SyncClient(d.address) as c:
            assert c.info("plain").length == 0  # nothing was appended
            assert c.stream("s").segments == []
        # A real transaction goes through, and a commit sent twice prints the same.
        r = cli(d, "txn", "begin", "plain")
        txn = r.stdout.decode().strip()
        assert cli(d, "txn", "append", txn, stdin=b"x\n").returncode == 0
        first = cli(d, "txn", "commit", txn)
        again = cli(d, "txn", "commit", txn)
        assert first.returncode == again.returncode == 0, again.stderr
        assert json.loads(again.stdout) == json.loads(first.stdout)
        assert json.loads(first.stdout)["segment"] == "plain"
        r = cli(d, "txn", "abort", txn)
        assert r.returncode == 43 and b"committed" in r.stderr, r.stderr
        with SyncClient(d.address) as c:
            assert c.read("plain", 0, 100).data == b"x\n"
    finally:
        d.kill()
