"""The daemon's embedded SeaweedFS: Ctrl-C, a killed ``weed``, and what stays behind.

Real ``segment-gateway serve`` processes with ``tier2.url = "embedded"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import ROOT, Daemon, free_port, run_cli, scrape
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB


def weed_pids(s3_dir: pathlib.Path) -> list[int]:
    """Live (not zombie) ``weed`` processes whose ``-dir`` is ``s3_dir``."""
    needle = f"-dir={s3_dir}".encode()
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "cmdline").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(int(proc.name))
    return pids


def chunks_in_tier2(s3_dir: pathlib.Path, node: str = "node-1") -> bytes:
    """The bytes of every chunk of the node, in key order, read from its stopped embedded S3."""
    server = EmbeddedS3(s3_dir)
    server.start()
    try:
        storage = S3Storage(
            server.bucket,
            endpoint_url=server.endpoint_url,
            access_key=server.access_key,
            secret_key=server.secret_key,
            timeout=10,
        )
        try:
            infos = list(storage.list(f"{node}/chunks/"))
            return b"".join(storage.read(i.key, 0, i.size) for i in infos)
        finally:
            storage.close()
    finally:
        server.stop()


@pytest.mark.timeout(150)
def test_ctrl_c_stops_the_node_in_about_the_time_the_flush_takes(tmp_path: pathlib.Path) -> None:
    """Ctrl-C signals the terminal's whole foreground process group: weed must not die first."""
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    config = data_dir / "gateway.toml"
    # Nothing flushes by itself: the stop flush has all the work.
    config.write_text(
        '[tier2]\nurl = "embedded"\nflush_interval = "1h"\nflush_size = "64 MiB"\n'
        'stop_flush_timeout = "30s"\n'
    )
    address = f"127.0.0.1:{free_port()}"
    ready = data_dir / "ready"
    log_path = data_dir / "daemon.log"
    with log_path.open("ab") as log:
        # Its own session, like a shell's foreground job: killpg below is the terminal's Ctrl-C.
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "gateway.cli", "--config", str(config), "serve",
                "--data-dir", str(data_dir), "--listen", address, "--ready-file", str(ready),
                "--mountpoint", "", "--metrics-listen", "",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the daemon is ready")
        assert proc.poll() is None, log_path.read_text()
        assert len(weed_pids(data_dir / "s3")) == 1
        data = os.urandom(3 * MiB + 17)
        with SyncClient(address) as c:
            c.create("c/s")
            for i in range(0, len(data), 256 * KiB):
                c.append("c/s", data[i : i + 256 * KiB])
            assert c.info("c/s").storage_length == 0  # all of it unflushed

        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        code = proc.wait(60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert code == 0, text
    assert took < 15, f"the stop took {took:.1f} s:\n{text}"
    for bad in ("InternalError", "temporary failure", "retry", "ERROR", "flush to Tier 2"):
        assert bad not in text, f"{bad!r} in the log:\n{text}"
    assert weed_pids(data_dir / "s3") == []
    assert chunks_in_tier2(data_dir / "s3") == data  # flushed by the stop, every byte


@pytest.mark.timeout(180)
@pytest.mark.expect_errors(r"embedded S3 server \(SeaweedFS, pid \d+\) exited")
def test_a_killed_weed_is_reported_and_restarted_without_restarting_the_daemon(
    tmp_path: pathlib.Path,
) -> None:
    data_dir = tmp_path / "node"
    config = '[tier2]\nurl = "embedded"\nflush_size = "64 KiB"\nflush_interval = "100ms"\n'
    daemon = Daemon(data_dir, config)
    s3_dir = data_dir / "s3"
    first = os.urandom(2 * MiB + 5)
    daemon.start(timeout=60)
    try:
        with SyncClient(daemon.address) as c:
            c.create("k/s")
            c.append("k/s", first)
            c.flush("k/s")
            assert c.info("k/s").storage_length == len(first)
        # Start again with the cache gone: reads of "first" must go to Tier 2.
        assert daemon.stop() == 0, daemon.log()
        wait_for(lambda: not weed_pids(s3_dir), 10, "weed stopped with the daemon")
        shutil.rmtree(data_dir / "cache")
        daemon.start(timeout=60)
        m = scrape(daemon.metrics_port)
        assert m["segment_gateway_embedded_s3_up"] == 1
        assert m["segment_gateway_embedded_s3_restarts_total"] == 0

        (pid,) = weed_pids(s3_dir)
        os.kill(pid, signal.SIGKILL)
        # Noticed at once, not at the next request.
        wait_for(
            lambda: scrape(daemon.metrics_port)["segment_gateway_embedded_s3_up"] == 0,
            2,
            "/metrics shows the server down",
        )
        # An uncached read fails fast while it is down (it would retry for 60 s otherwise).
        with SyncClient(daemon.address) as c:
            started = time.monotonic()
            with pytest.raises(GatewayError, match="embedded S3 server is down"):
                c.read("k/s", 0, 64 * KiB)
            assert time.monotonic() - started < 5
            # Appends still land in the journal; their flush fails until the server is back.
            middle = os.urandom(100 * KiB)
            c.append("k/s", middle)
        wait_for(
            lambda: scrape(daemon.metrics_port)["segment_gateway_embedded_s3_up"] == 1,
            30,
            "/metrics shows the server up again",
        )
        m = scrape(daemon.metrics_port)
        assert m["segment_gateway_embedded_s3_restarts_total"] == 1
        assert m["segment_gateway_embedded_s3_exits_total"] == 1
        assert m["segment_gateway_embedded_s3_last_exit_status"] == -signal.SIGKILL
        assert m['segment_gateway_embedded_s3_state{state="up"}'] == 1
        (new_pid,) = weed_pids(s3_dir)
        assert new_pid != pid

        log = daemon.log_path.read_text()
        errors = [line for line in log.splitlines() if "ERROR" in line]
        assert len(errors) == 1 and f"(SeaweedFS, pid {pid}) exited" in errors[0], errors
        assert "killed by SIGKILL" in errors[0]
        assert "--- end of" in log  # the tail of weed's log follows the line
        assert "restarting it (attempt 1)" in log

        # The failed flush is retried by the storage writer's backoff, and succeeds.
        with SyncClient(daemon.address) as c:
            wait_for(
                lambda: c.info("k/s").storage_length == len(first) + len(middle),
                40,
                "the flush that failed while the server was down succeeds by itself",
            )
        assert "failed (retry in 0.5s): embedded S3 server is down (restarting)" in (
            daemon.log_path.read_text()
        )
        # Cold reads and new flushes work again, same daemon process.
        second = os.urandom(300 * KiB)
        with SyncClient(daemon.address) as c:
            assert c.read("k/s", 0, len(first)).data == first
            c.append("k/s", second)
            c.flush("k/s")
            assert c.info("k/s").storage_length == len(first) + len(middle) + len(second)
            assert c.read("k/s", 0, 10 * MiB).data == first + middle + second
        assert daemon.starts == 2

        # The restarted weed dies with a killed daemon too (it was started from the
        # daemon's main thread, whose end fires its parent-death signal).
        daemon.kill()
        wait_for(lambda: not weed_pids(s3_dir), 10, "the restarted weed died with the daemon")
    finally:
        daemon.kill()


@contextlib.contextmanager
def holding_port(port: int) -> Iterator[None]:
    """Listen on a loopback port, so a SeaweedFS restart on its ports fails meanwhile."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def bound() -> bool:
            s.bind(("127.0.0.1", port))  # OSError: the killed weed's listener is not closed yet
            return True

        wait_for(bound, 10, f"port {port} free", interval=0.005)
        s.listen()
        yield


def flush_failures(daemon: Daemon) -> int:
    """How many flush attempts the daemon's log says failed."""
    return len(re.findall(r"flush of segment id \d+ failed", daemon.log_path.read_text()))


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(r"embedded S3 server \(SeaweedFS, pid \d+\) exited")
def test_flush_waits_while_the_embedded_s3_server_restarts(tmp_path: pathlib.Path) -> None:
    """`flush` is "make it durable and wait": it outlasts a restart, within its --timeout."""
    data_dir = tmp_path / "node"
    # Nothing is flushed but what is asked for.
    config = '[tier2]\nurl = "embedded"\nflush_size = "64 MiB"\nflush_interval = "1h"\n'
    daemon = Daemon(data_dir, config)
    s3_dir = data_dir / "s3"
    data = os.urandom(1 * MiB + 17)
    daemon.start(timeout=60)
    try:
        with SyncClient(daemon.address) as c:
            c.create("k/s")
            c.append("k/s", data)
            assert c.info("k/s").storage_length == 0
        s3_port = json.loads((s3_dir / "embedded-s3.json").read_text())["ports"]["s3"]
        (pid,) = weed_pids(s3_dir)
        os.kill(pid, signal.SIGKILL)
        # Its restarts fail while the port is taken: the server stays down.
        with holding_port(s3_port):
            wait_for(
                lambda: scrape(daemon.metrics_port)["segment_gateway_embedded_s3_up"] == 0,
                10,
                "/metrics shows the server down",
            )
            started = time.monotonic()
            r = run_cli("flush", "k/s", "--connect", daemon.address, "--timeout", "2")
            took = time.monotonic() - started
            assert r.returncode == 27, r.stderr
            assert re.fullmatch(
                rf"segment-gateway: flush of 'k/s': {len(data)} byte\(s\) not in Tier 2 after "
                r"waiting 2\.\ds; the storage writer keeps retrying, its last attempt failed: "
                r"embedded S3 server is down \(restarting\) \(a flush's time ran out; the data "
                r"is safe in the journal and is flushed later\)\n",
                r.stderr,
            ), r.stderr
            assert 2 <= took < 30, took

            # Without a short --timeout, the flush waits for the server.
            before = flush_failures(daemon)
            waiting = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "flush", "k/s", "--connect", daemon.address],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                wait_for(lambda: flush_failures(daemon) >= before + 2, 30, "it retries meanwhile")
                assert waiting.poll() is None, waiting.communicate()
            except BaseException:
                waiting.kill()
                raise
        # The port is free: the next restart succeeds, and so does the flush.
        out, err = waiting.communicate(timeout=90)
        assert (waiting.returncode, out, err) == (0, "flushed k/s to Tier 2\n", "")
        with SyncClient(daemon.address) as c:
            assert c.info("k/s").storage_length == len(data)
        assert scrape(daemon.metrics_port)["segment_gateway_embedded_s3_restarts_total"] == 1
        assert daemon.stop() == 0, daemon.log()
        assert chunks_in_tier2(s3_dir) == data
    finally:
        daemon.kill()
