"""The embedded SeaweedFS: start, crash, restart with the data kept, and failing clearly.

Each test that starts a server starts its own (about 2.5 s), apart from the
session's, since it stops or kills it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import pathlib
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import boto3
import pytest
import trio
from botocore import UNSIGNED
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from gateway.embedded import (
    IDENTITIES_FILE,
    PORTS_FILE,
    EmbeddedS3,
    EmbeddedS3Down,
    EmbeddedS3Error,
    find_weed,
    run_embedded_s3,
)
from gateway.embedded.ports import port_free
from gateway.storage.layer import ChunkLayer
from gateway.storage.s3 import MIN_PART_SIZE, S3Storage
from tests.helpers.wait import async_wait_for, wait_for

from .conftest import ROOT

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow


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
    assert not (tmp_path / "s3" / PORTS_FILE).exists()  # never got ready
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
from gateway.embedded import EmbeddedS3
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
        wait_for(lambda: gone(weed_pid), 10, f"weed (pid {weed_pid}) gone with its parent")
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


def test_a_port_whose_socket_another_user_left_is_not_chosen(tmp_path: pathlib.Path) -> None:
    """A killed root ``weed`` left /tmp/seaweedfs-*-<port>.sock: the service user skips the port.

    ``weed`` running as that user cannot remove root's file and its listener
    never serves (seen in CI: the packaged daemon never became ready).
    """
    with listen_below_55535() as probe:
        port = probe.getsockname()[1]
    ours = pathlib.Path(f"/tmp/seaweedfs-volume-grpc-{port}.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(ours))
    stale.close()  # as a SIGKILLed weed leaves it: the file, nobody listening
    try:
        check = (
            "import sys; from gateway.embedded.ports import port_free; "
            f"sys.exit(0 if port_free({port}) else 3)"
        )
        as_nobody = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             sys.executable, "-c", check],
            cwd=ROOT, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert as_nobody.returncode == 3, as_nobody.stderr
        assert ours.exists(), "another user's socket must be left alone"
        assert port_free(port), "a stale socket of our own is removed and the port used"
        assert not ours.exists()
    finally:
        ours.unlink(missing_ok=True)


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


# -- identity and what the other ports allow ------------------------------------------


def mode_of(path: pathlib.Path) -> int:
    return path.stat().st_mode & 0o777


def refused(call: Callable[[], object]) -> str:
    """The S3 error code ``call`` fails with (it must fail)."""
    with pytest.raises(ClientError) as e:
        call()
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return str(e.value.response["Error"]["Code"])


@pytest.mark.timeout(90)
def test_only_the_generated_identity_may_use_the_s3_api(tmp_path: pathlib.Path) -> None:
    s3_dir = tmp_path / "s3"
    server = EmbeddedS3(s3_dir, bucket="private")
    server.start()
    try:
        identity = s3_dir / IDENTITIES_FILE
        assert mode_of(identity) == 0o600 and mode_of(s3_dir) == 0o700
        assert mode_of(s3_dir / "security.toml") == 0o600
        assert mode_of(s3_dir / "tls" / "weed.key") == 0o600
        assert server.access_key in identity.read_text()
        assert server.secret_key in identity.read_text()
        storage = client_of(server)
        try:
            storage.write("n/chunks/1/a", b"the chunk", {})
        finally:
            storage.close()

        def s3(access_key: str | None, secret_key: str | None) -> Any:
            return boto3.client(
                "s3",
                endpoint_url=server.endpoint_url,
                region_name="us-east-1",
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=BotoConfig(
                    retries={"max_attempts": 1},
                    signature_version=UNSIGNED if access_key is None else None,
                ),
            )

        wrong_secret = s3(server.access_key, "x" * 40)
        unknown_key = s3("AKIAIOSFODNN7EXAMPLE", server.secret_key)
        anonymous = s3(None, None)
        for client in (wrong_secret, unknown_key, anonymous):
            try:
                refused(lambda c=client: c.list_buckets())
                refused(lambda c=client: c.list_objects_v2(Bucket="private"))
                refused(lambda c=client: c.get_object(Bucket="private", Key="n/chunks/1/a"))
                refused(
                    lambda c=client: c.put_object(Bucket="private", Key="n/chunks/1/a", Body=b"x")
                )
                refused(lambda c=client: c.delete_object(Bucket="private", Key="n/chunks/1/a"))
                refused(lambda c=client: c.delete_bucket(Bucket="private"))
            finally:
                client.close()
        # Nothing changed; and the identity is kept across restarts of the server.
        keys = (server.access_key, server.secret_key)
        server.stop()
        again = EmbeddedS3(s3_dir, bucket="private")
        assert (again.access_key, again.secret_key) == keys
        server.start()
        storage = client_of(server)
        try:
            assert [i.key for i in storage.list("")] == ["n/chunks/1/a"]
            assert storage.read("n/chunks/1/a", 0, 100) == b"the chunk"
        finally:
            storage.close()
    finally:
        server.stop()


def test_a_damaged_identity_file_is_a_clear_error_and_kept(tmp_path: pathlib.Path) -> None:
    s3_dir = tmp_path / "s3"
    s3_dir.mkdir()
    damaged = '{"identities": [{"name": "someone-else"}]}'
    (s3_dir / IDENTITIES_FILE).write_text(damaged)
    server = EmbeddedS3(s3_dir)
    with pytest.raises(EmbeddedS3Error) as e:
        server.start()
    assert f"cannot use {s3_dir / IDENTITIES_FILE}: no identity 'segment-gateway'" in str(e.value)
    assert (s3_dir / IDENTITIES_FILE).read_text() == damaged  # not replaced
    assert server.pid is None and weeds_serving(s3_dir) == []


def http_status(port: int, method: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=b"evil" if method in ("PUT", "POST") else None)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# An HTTP/2 client's first bytes: the preface and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def grpc_answers(port: int, tls: ssl.SSLContext | None = None) -> bool:
    """Whether the server on ``port`` answers an HTTP/2 (gRPC) client with its SETTINGS frame."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = raw
    try:
        if tls is not None:
            sock = tls.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
            sock.do_handshake()
        sock.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            data = sock.recv(9 - len(head))
            if not data:
                return False
            head += data
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return False
    finally:
        sock.close()
        raw.close()
    return head[3] == 4  # frame type SETTINGS


def tls_context(s3_dir: pathlib.Path, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(s3_dir / "tls" / "ca.pem"))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    if with_certificate:
        context.load_cert_chain(s3_dir / "tls" / "weed.pem", s3_dir / "tls" / "weed.key")
    return context


def weed_shell(server: EmbeddedS3, command: str) -> str:
    """Run one ``weed shell`` command from the data directory (so with its certificate)."""
    p = server.ports
    assert p is not None
    r = subprocess.run(
        [
            find_weed(), "shell",
            f"-master=127.0.0.1:{p.master}.{p.master_grpc}",
            f"-filer=127.0.0.1:{p.filer}.{p.filer_grpc}",
        ],
        input=f"{command}\nexit\n", cwd=server.data_dir, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return r.stdout


@pytest.mark.timeout(120)
def test_the_other_ports_give_no_access_to_chunks(tmp_path: pathlib.Path) -> None:
    server = EmbeddedS3(tmp_path / "s3", bucket="guarded")
    server.start()
    try:
        data = os.urandom(100_000)
        storage = client_of(server)
        try:
            storage.write("n/chunks/1/a", data, {})
        finally:
            storage.close()
        p = server.ports
        assert p is not None

        # Every gRPC port wants a client certificate from the server's CA; the
        # certificate works (so the refusals below are refusals, not a dead port).
        for port in (p.master_grpc, p.volume_grpc, p.filer_grpc, p.s3_grpc):
            assert not grpc_answers(port), f"gRPC port {port} answers in clear text"
            assert not grpc_answers(port, tls_context(server.data_dir, False)), port
            assert grpc_answers(port, tls_context(server.data_dir, True)), port
        # With it, `weed shell` (run from the data directory) finds the chunk's needle.
        shown = weed_shell(server, "fs.meta.cat /buckets/guarded/n/chunks/1/a")
        fids = re.findall(r'"fileId":\s*"([0-9]+,[0-9a-f]+)"', shown)
        assert fids, shown

        # The master's and filer's HTTP APIs are off; the volume server wants a JWT.
        for method, path in [
            ("GET", "/dir/assign"),
            ("POST", "/dir/assign"),
            ("GET", f"/dir/lookup?volumeId={fids[0].split(',')[0]}"),
            ("GET", "/col/delete?collection=guarded"),
            ("GET", "/vol/grow?collection=guarded&count=1"),
            ("GET", "/vol/vacuum"),
            ("POST", "/submit"),
            ("GET", f"/{fids[0]}"),
        ]:
            status = http_status(p.master, method, path)
            assert not 200 <= status < 400, (method, path, status)
        for method in ("GET", "HEAD", "PUT", "POST", "DELETE"):
            for path in ("/buckets/guarded/n/chunks/1/a", "/buckets/guarded/n/chunks/1/b"):
                status = http_status(p.filer, method, path)
                assert not 200 <= status < 400, (method, path, status)
        for method in ("GET", "HEAD", "PUT", "POST", "DELETE"):
            for fid in fids:
                status = http_status(p.volume, method, f"/{fid}")
                assert status == 401, (method, fid, status)

        storage = client_of(server)
        try:
            assert [i.key for i in storage.list("")] == ["n/chunks/1/a"]
            assert storage.read("n/chunks/1/a", 0, len(data)) == data
        finally:
            storage.close()
    finally:
        server.stop()


# -- supervision --------------------------------------------------------------------


@pytest.mark.expect_errors(r"embedded S3 server \(SeaweedFS, pid \d+\) exited")
async def test_a_killed_server_fails_calls_fast_and_is_restarted(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.embedded")
    async with run_embedded_s3(tmp_path / "s3") as server:
        storage = client_of(server)
        layer = ChunkLayer(storage, retry_deadline=60, embedded=server)
        try:
            data = os.urandom(MIN_PART_SIZE + 1)
            await layer.write("n/chunks/1/a", data, {})
            first = server.statistics()
            assert (first.state, first.exits, first.restarts) == ("up", 0, 0)
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)

            await async_wait_for(lambda: server.state != "up", 2, "the server noticed down")
            # Fails at once instead of retrying for retry_deadline (60 s).
            with trio.fail_after(1), pytest.raises(EmbeddedS3Down) as e:
                await layer.read("n/chunks/1/a", 0, 10)
            assert str(e.value) == "embedded S3 server is down (restarting)"
            down = server.statistics()
            assert down.state in ("down", "starting") and down.exits == 1
            assert down.last_exit_status == -signal.SIGKILL

            await async_wait_for(lambda: server.state == "up", 30, "the server up again")
            after = server.statistics()
            assert (after.exits, after.restarts, after.restart_attempts) == (1, 1, 1)
            assert after.pid not in (None, first.pid)
            # Same ports, same data.
            assert await layer.read("n/chunks/1/a", 0, len(data)) == data
            await layer.write("n/chunks/1/b", b"after the restart", {})
        finally:
            await trio.to_thread.run_sync(storage.close)

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert f"(SeaweedFS, pid {first.pid}) exited (killed by SIGKILL)" in message
    assert f"--- end of {server.log_path}.1 ---" not in message  # the log before rotation
    assert f"--- end of {server.log_path} ---" in message
    assert "restarting it (attempt 1) in 0.5 s" in caplog.text
    assert "is up again" in caplog.text
    assert server.state == "stopped" and weeds_serving(tmp_path / "s3") == []


@pytest.mark.expect_errors(r"embedded S3 server \(SeaweedFS, pid \d+\) exited")
async def test_restarts_back_off_while_they_fail(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.embedded")
    async with run_embedded_s3(
        tmp_path / "s3", restart_first_delay=0.4, restart_max_delay=0.8
    ) as server:
        ports = server.ports
        assert ports is not None and server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        await async_wait_for(lambda: server.state == "down", 2, "the server down")
        # Someone takes the S3 port: restarts must not move to another (clients know it).
        with socket.socket() as squatter:
            # Past the killed server's connections in TIME_WAIT, as weed's own listeners do.
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", ports.s3))
            squatter.listen()
            await async_wait_for(
                lambda: "restart attempt 3 failed" in caplog.text, 10, "a third failed restart"
            )
            assert server.state == "down" and server.statistics().restart_attempts == 3
            with pytest.raises(EmbeddedS3Down):
                server.check_available()
        await async_wait_for(lambda: server.state == "up", 30, "the server up again")
        assert server.ports == ports and server.statistics().restarts == 1

    delays = re.findall(r"restarting it \(attempt (\d+)\) in ([\d.]+) s", caplog.text)
    assert delays[:4] == [("1", "0.4"), ("2", "0.8"), ("3", "0.8"), ("4", "0.8")]
    assert f"port {ports.s3} on 127.0.0.1 (s3) is in use" in caplog.text
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
