"""The embedded SeaweedFS: start, crash, restart with the data kept, and failing clearly.

Each test that starts a server starts its own (about 2.5 s), apart from the
session's, since it stops or kills it.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import trio

from gateway.tier2.embedded import PORTS_FILE, EmbeddedS3, EmbeddedS3Error, run_embedded_s3
from gateway.tier2.layer import ChunkLayer
from gateway.tier2.s3 import MIN_PART_SIZE, S3Storage

from .conftest import ROOT


def client_of(server: EmbeddedS3) -> S3Storage:
    return S3Storage(
        server.bucket,
        endpoint_url=server.endpoint_url,
        access_key=server.access_key,
        secret_key=server.secret_key,
        timeout=5,
    )


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for init counts as gone)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_crash_and_restart_keep_the_data(tmp_path: pathlib.Path) -> None:
    server = EmbeddedS3(tmp_path / "s3", bucket="kept")
    server.start()
    try:
        assert server.startup_seconds is not None and server.startup_seconds < 30
        endpoint, pid = server.endpoint_url, server.pid
        assert pid is not None and endpoint.startswith("http://127.0.0.1:")
        big = os.urandom(MIN_PART_SIZE + 3)
        storage = client_of(server)
        try:
            storage.write("n/chunks/1/a", big, {"crc32c": "1"})
            storage.write("n/chunks/1/b", b"small", {})
        finally:
            storage.close()

        server.sync()  # what the daemon does before relying on them surviving a power loss
        server.kill()  # as a crash would
        server.start()  # reaps it, then reuses the ports and the data
        assert server.endpoint_url == endpoint and server.pid not in (None, pid)
        storage = client_of(server)
        try:
            assert storage.read("n/chunks/1/a", 0, len(big)) == big
            assert dict(storage.stat("n/chunks/1/a").metadata) == {"crc32c": "1"}
            assert [i.key for i in storage.list("")] == ["n/chunks/1/a", "n/chunks/1/b"]
            storage.write("n/chunks/1/c", b"after the restart", {})
        finally:
            storage.close()
        saved = json.loads((tmp_path / "s3" / PORTS_FILE).read_text())
        assert saved["ports"]["s3"] == int(endpoint.rsplit(":", 1)[1])
    finally:
        server.stop()
    assert server.pid is None
    ports = server.ports
    assert ports is not None
    assert not list(pathlib.Path("/tmp").glob(f"seaweedfs-*-{ports.s3}.sock"))
    assert (tmp_path / "s3" / "weed.log.1").exists()  # the crashed run's log is kept


async def test_run_embedded_s3_serves_the_block(tmp_path: pathlib.Path) -> None:
    async with run_embedded_s3(tmp_path / "s3") as server:
        pid = server.pid
        assert pid is not None
        storage = client_of(server)
        layer = ChunkLayer(storage, retry_deadline=10)
        try:
            await layer.write("k", b"via the layer", {"a": "b"})
            assert await layer.read("k", 4, 100) == b"the layer"
        finally:
            await trio.to_thread.run_sync(storage.close)
    assert server.pid is None and gone(pid)


async def test_run_embedded_s3_stops_the_server_when_cancelled(tmp_path: pathlib.Path) -> None:
    pids: list[int] = []
    with trio.move_on_after(0.3):
        async with run_embedded_s3(tmp_path / "s3") as server:  # still starting when cancelled
            pids.append(server.pid or 0)
    assert not pids  # the block never ran
    assert not list((tmp_path / "s3").glob("*.json"))  # never got ready
    assert weeds_serving(tmp_path / "s3") == []  # killed and reaped


def weeds_serving(data_dir: pathlib.Path) -> list[int]:
    """Live processes whose command line names ``data_dir`` as their -dir."""
    needle = f"-dir={data_dir}".encode()
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes().split(b"\0") and not gone(
                    int(proc.name)
                ):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


# Starts weed without waiting for it, prints its pid, then waits to be killed.
_PARENT = """
import pathlib, sys, time
from gateway.tier2.embedded import EmbeddedS3
server = EmbeddedS3(pathlib.Path(sys.argv[1]))
server.spawn()
print(server.pid, flush=True)
time.sleep(120)
"""


def test_weed_dies_with_a_killed_parent(tmp_path: pathlib.Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "s3")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        weed_pid = int(parent.stdout.readline())
        assert not gone(weed_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert wait_gone(weed_pid), f"weed (pid {weed_pid}) outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def listen_below_55535() -> socket.socket:
    """A listening loopback socket on a port whose +10000 exists (an S3 port we may ask for)."""
    for port in range(21_000, 31_000, 7):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
    raise RuntimeError("no free port")


def test_a_taken_port_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with listen_below_55535() as taken:
        port = taken.getsockname()[1]
        server = EmbeddedS3(tmp_path / "s3", port=port)
        start = time.monotonic()
        with pytest.raises(EmbeddedS3Error) as e:
            server.start()
        assert time.monotonic() - start < 5
    assert f"port {port} on 127.0.0.1 (s3) is in use" in str(e.value)
    assert str(e.value).startswith("embedded S3 server (SeaweedFS) failed: ")
    assert server.pid is None


def test_weed_dying_at_start_shows_its_log(tmp_path: pathlib.Path) -> None:
    server = EmbeddedS3(tmp_path / "s3", extra_args=["-no-such-flag"])
    with pytest.raises(EmbeddedS3Error) as e:
        server.start(timeout=30)
    message = str(e.value)
    assert "weed exited with status" in message and "while starting" in message
    assert "flag provided but not defined: -no-such-flag" in message  # the log's tail
    assert server.pid is None


def test_missing_weed_is_a_clear_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedS3Error, match=r"`weed` is neither in .* nor on PATH"):
        EmbeddedS3(tmp_path / "s3").start()


def test_arguments_are_checked(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="at least 3 characters"):
        EmbeddedS3(tmp_path, bucket="ab")
    with pytest.raises(ValueError, match="gRPC port is \\+10000"):
        EmbeddedS3(tmp_path, port=60000)
    with pytest.raises(EmbeddedS3Error, match="not started"):
        _ = EmbeddedS3(tmp_path).endpoint_url
