"""TLS on the protocol port and token auth (docs/SECURITY.md).

Certificates come from trustme: a throwaway CA and a server certificate for
127.0.0.1 and localhost, made fresh for the session, plus a second CA that
nobody should trust.
"""

from __future__ import annotations

import logging
import os
import pathlib
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import trio
import trio.testing
import trustme

from gateway.client.client import client_ssl_context, open_client
from gateway.client.sync import SyncClient
from gateway.client.writer import open_segment_writer
from gateway.config import Config
from gateway.errors import (
    ConfigError,
    ConnectionLost,
    LimitExceeded,
    SegmentNotFound,
    Unauthorized,
)
from gateway.protocol import wire_pb2 as wire
from gateway.server.hello import token_matches
from tests.helpers.wait import wait_for

from .conftest import ROOT
from .helpers.daemon import Daemon
from .helpers.inprocess import Served, served
from .helpers.mount import MountedDaemon, require_fuse
from .helpers.segments import make_config

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

TOKEN = "tok-5e8f1c2a9b7d4e6f"


@dataclass
class Pki:
    """PEM files: the trusted CA, the server's certificate and key, and strangers."""

    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path
    other_ca: pathlib.Path
    #: A client certificate signed by `ca` (cert and key in one file).
    client: pathlib.Path
    #: A client certificate signed by `other_ca`.
    stranger: pathlib.Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(d / "cert.pem"), append=True)
    server.private_key_pem.write_to_path(str(d / "key.pem"))
    ca.issue_cert("client@example").private_key_and_cert_chain_pem.write_to_path(
        str(d / "client.pem")
    )
    other.issue_cert("client@example").private_key_and_cert_chain_pem.write_to_path(
        str(d / "stranger.pem")
    )
    return Pki(
        d / "ca.pem",
        d / "cert.pem",
        d / "key.pem",
        d / "other-ca.pem",
        d / "client.pem",
        d / "stranger.pem",
    )


def tls_config(tmp_path: pathlib.Path, pki: Pki, **server: str | int) -> Config:
    return make_config(
        tmp_path,
        server={"tls_cert": str(pki.cert), "tls_key": str(pki.key), "token": TOKEN, **server},
    )


@pytest.fixture
async def tls_server(tmp_path: pathlib.Path, pki: Pki) -> AsyncIterator[Served]:
    async with served(tls_config(tmp_path, pki)) as s:
        yield s


async def test_tls_client_trusting_the_ca_round_trips_bytes(tls_server: Served, pki: Pki) -> None:
    small = b"hello over TLS\n"
    big = os.urandom(300 * 1024)  # large enough for the split-append and direct-receive paths
    async with open_client(tls_server.address, TOKEN, tls_ca=str(pki.ca)) as c:
        assert c.server_hello is not None and c.server_hello.server.startswith("segment-gateway")
        await c.create("tls/one")
        assert (await c.append("tls/one", small)).offset == 0
        assert (await c.append("tls/one", big)).offset == len(small)
        futures = [await c.start_append("tls/one", bytes([i]) * 1000) for i in range(20)]
        offsets = [(await f.wait()).append.offset for f in futures]
        assert offsets == [len(small) + len(big) + 1000 * i for i in range(20)]
        expected = small + big + b"".join(bytes([i]) * 1000 for i in range(20))
        got = await c.read("tls/one", 0, 1 << 22)
        assert got.data == expected
    # The data really went through the container, not a side channel.
    assert tls_server.container.info("tls/one").length == len(expected)
    # The name on the certificate may be used instead of the address.
    async with open_client(
        tls_server.address, TOKEN, tls_ca=str(pki.ca), server_hostname="localhost"
    ) as c:
        assert (await c.info("tls/one")).length == len(expected)


async def test_segment_writer_over_tls(tls_server: Served, pki: Pki) -> None:
    events = [f"event {i}".encode() for i in range(500)]
    async with open_client(tls_server.address, TOKEN, tls_ca=str(pki.ca)) as c:
        await c.create("tls/events")
    async with open_segment_writer(
        tls_server.address,
        "tls/events",
        codec="lines",
        token=TOKEN,
        ssl_context=client_ssl_context(str(pki.ca)),
    ) as w:
        for e in events:
            await w.write(e)
    async with open_client(tls_server.address, TOKEN, tls_ca=str(pki.ca)) as c:
        assert (await c.read("tls/events", 0, 1 << 20)).data == b"\n".join(events) + b"\n"


def test_sync_client_over_tls(tls_daemon: Daemon, pki: Pki) -> None:
    with SyncClient(tls_daemon.address, TOKEN, tls_ca=str(pki.ca)) as c:
        c.create("sync/tls")
        assert c.append("sync/tls", b"abc").offset == 0
        assert c.read("sync/tls").data == b"abc"
    with pytest.raises(ConnectionLost, match="not trusted"):
        SyncClient(tls_daemon.address, TOKEN, tls_ca=str(pki.other_ca))


async def test_client_trusting_another_ca_is_refused(tls_server: Served, pki: Pki) -> None:
    with pytest.raises(ConnectionLost, match="certificate is not trusted") as info:
        async with open_client(tls_server.address, TOKEN, tls_ca=str(pki.other_ca)):
            pytest.fail("connected with an untrusted certificate")
    assert "\n" not in str(info.value)
    # The system CAs do not know the test CA either.
    with pytest.raises(ConnectionLost, match="not trusted"):
        async with open_client(tls_server.address, TOKEN, ssl_context=client_ssl_context()):
            pass
    await trio.testing.wait_all_tasks_blocked()  # the server's side of the failures
    assert tls_server.server.handshake_failures == 2
    assert tls_server.container.segment_count == 0


async def test_wrong_server_name_is_refused(tls_server: Served, pki: Pki) -> None:
    with pytest.raises(ConnectionLost, match=r"not valid for 'db\.example\.com'"):
        async with open_client(
            tls_server.address, TOKEN, tls_ca=str(pki.ca), server_hostname="db.example.com"
        ):
            pass


async def test_plaintext_client_fails_cleanly_and_others_keep_working(
    tls_server: Served, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.server")
    tls_server.server.handshake_timeout = 0.5
    host, port = tls_server.address.rsplit(":", 1)
    async with open_client(tls_server.address, TOKEN, tls_ca=str(pki.ca)) as good:
        await good.create("ok")
        # A plaintext client of the library gets a one-line hint.
        with pytest.raises(ConnectionLost, match="does it require TLS"):
            async with open_client(tls_server.address, TOKEN):
                pass
        # Raw junk, and a client that connects and says nothing: both are
        # dropped by their own tasks while the good client carries on.
        junk = await trio.open_tcp_stream(host, int(port))
        await junk.send_all(b"GET / HTTP/1.0\r\n\r\n")
        silent = await trio.open_tcp_stream(host, int(port))
        for i in range(10):
            assert (await good.append("ok", b"x" * 10)).offset == 10 * i
        with trio.fail_after(5):
            while await junk.receive_some(1024):
                pass
            # The silent one is closed once the handshake deadline passes.
            assert await silent.receive_some(1024) == b""
        await junk.aclose()
        await silent.aclose()
        assert (await good.read("ok", 0, 1000)).data == b"x" * 100
    assert tls_server.server.handshake_failures >= 3
    assert tls_server.container.info("ok").length == 100
    failures = [r for r in caplog.records if "TLS handshake failed" in r.getMessage()]
    assert any("timed out" in r.getMessage() for r in failures)
    assert all(r.levelno == logging.INFO for r in failures)
    assert all("127.0.0.1:" in r.getMessage() for r in failures), "the peer is named"


async def test_tls_client_to_a_plaintext_server(tmp_path: pathlib.Path, pki: Pki) -> None:
    async with served(make_config(tmp_path)) as s:
        with pytest.raises(ConnectionLost, match="does the server use TLS"):
            async with open_client(s.address, tls_ca=str(pki.ca)):
                pass
        async with open_client(s.address) as c:  # and it still serves plaintext clients
            await c.create("fine")


class RawTls:
    """Hand-made requests over TLS, to pipeline what the client library would not."""

    def __init__(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, *requests: wire.Request) -> None:
        data = b"".join(
            struct.pack(">I", len(r.SerializeToString())) + r.SerializeToString() for r in requests
        )
        await self.stream.send_all(data)

    async def receive(self) -> wire.Response | None:
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    msg, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    return wire.Response.FromString(msg)
            try:
                chunk = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return None  # closed without close_notify: the server hung up
            if not chunk:
                return None
            self.buf += chunk

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def raw_tls(address: str, pki: Pki) -> RawTls:
    host, port = address.rsplit(":", 1)
    tcp = await trio.open_tcp_stream(host, int(port))
    stream = trio.SSLStream(tcp, client_ssl_context(str(pki.ca)), server_hostname=host)
    await stream.do_handshake()
    return RawTls(stream)


async def test_missing_or_wrong_token_is_unauthorized_and_nothing_applied(
    tls_server: Served, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ca = str(pki.ca)
    for token in ("", "wrong", TOKEN[:-1], TOKEN + "x"):
        with pytest.raises(Unauthorized):
            async with open_client(tls_server.address, token, tls_ca=ca):
                pass

    def create(rid: int, name: str) -> wire.Request:
        return wire.Request(request_id=rid, create=wire.CreateSegmentRequest(segment=name))

    def append(rid: int, name: str) -> wire.Request:
        return wire.Request(request_id=rid, append=wire.AppendRequest(segment=name, data=b"x"))

    # A bad Hello with requests pipelined behind it: none of them is served.
    r = await raw_tls(tls_server.address, pki)
    bad = wire.Request(request_id=1, hello=wire.Hello(protocol_version=1, token="nope"))
    await r.send(bad, create(2, "sneaky"), append(3, "sneaky"))
    first = await r.receive()
    assert first is not None and first.error.code == wire.UNAUTHORIZED, first
    assert await r.receive() is None, "the server must close after a bad token"
    await r.aclose()
    # Requests without any Hello: refused, not served.
    r = await raw_tls(tls_server.address, pki)
    await r.send(create(1, "sneaky"), append(2, "sneaky"))
    first = await r.receive()
    assert first is not None and first.error.code == wire.UNAUTHORIZED, first
    assert await r.receive() is None
    await r.aclose()
    with pytest.raises(SegmentNotFound):
        tls_server.container.info("sneaky")
    assert tls_server.container.segment_count == 0

    async with open_client(tls_server.address, TOKEN, tls_ca=ca) as c:
        await c.create("allowed")
        assert (await c.append("allowed", b"yes")).length == 3
    log_text = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "bad or missing token" in log_text
    assert TOKEN not in log_text and TOKEN[:-1] not in log_text


async def test_unauthenticated_peers_cannot_hoard_slots_or_memory(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, server={"token": TOKEN, "max_connections": 2})
    async with served(config) as s:
        s.server.handshake_timeout = 0.5
        host, port = s.address.rsplit(":", 1)
        # Two idle sockets take both slots, but only until the Hello deadline.
        idle = [await trio.open_tcp_stream(host, int(port)) for _ in range(2)]
        with trio.fail_after(5):
            for stream in idle:
                assert await stream.receive_some(1024) == b""
                await stream.aclose()
        async with open_client(s.address, TOKEN) as c:
            await c.create("after-idle")
        # A huge first message is refused by its length alone (TOO_LARGE),
        # though max_message_bytes (1 MiB here) would allow it after Hello.
        big = await trio.open_tcp_stream(host, int(port))
        await big.send_all(struct.pack(">I", 512 * 1024))
        with trio.fail_after(5):
            data = b""
            while chunk := await big.receive_some(1024):
                data += chunk
        await big.aclose()
        (n,) = struct.unpack(">I", data[:4])
        assert wire.Response.FromString(data[4 : 4 + n]).error.code == wire.TOO_LARGE
        assert s.container.segment_count == 1


def test_token_comparison() -> None:
    assert token_matches(TOKEN, TOKEN)
    for other in ("", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "é" + TOKEN[1:]):
        assert not token_matches(other, TOKEN)


async def test_mutual_tls(tmp_path: pathlib.Path, pki: Pki) -> None:
    config = tls_config(tmp_path, pki, tls_client_ca=str(pki.ca))
    async with served(config) as s:
        ok = client_ssl_context(str(pki.ca), cert_file=str(pki.client))
        async with open_client(s.address, TOKEN, ssl_context=ok) as c:
            await c.create("mtls")
        for cert in (None, str(pki.stranger)):
            with pytest.raises(ConnectionLost, match="client certificate"):
                ctx = client_ssl_context(str(pki.ca), cert_file=cert)
                async with open_client(s.address, TOKEN, ssl_context=ctx) as c:
                    await c.create("not-allowed")
        assert [i.name for i in s.container.list("", "", 10)] == ["mtls"]


async def test_max_connections_with_tls(tmp_path: pathlib.Path, pki: Pki) -> None:
    async with served(tls_config(tmp_path, pki, max_connections=1)) as s:
        async with open_client(s.address, TOKEN, tls_ca=str(pki.ca)) as first:
            with pytest.raises(LimitExceeded, match=r"server\.max_connections"):
                async with open_client(s.address, TOKEN, tls_ca=str(pki.ca)):
                    pass
            await first.create("still-fine")
        await trio.testing.wait_all_tasks_blocked()
        async with open_client(s.address, TOKEN, tls_ca=str(pki.ca)) as again:
            assert (await again.info("still-fine")).length == 0


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ({"tls_cert": "CERT"}, "server.tls_key: required when server.tls_cert is set"),
        ({"tls_key": "KEY"}, "server.tls_cert: required when server.tls_key is set"),
        ({"tls_cert": "/nonexistent/cert.pem", "tls_key": "KEY"}, "server.tls_cert: cannot read"),
        ({"tls_cert": "CERT", "tls_key": "/nonexistent/k.pem"}, "server.tls_key: cannot read"),
        ({"tls_cert": "cert.pem", "tls_key": "KEY"}, "server.tls_cert: must be an absolute path"),
        ({"tls_cert": "KEY", "tls_key": "CERT"}, "server.tls_cert: "),
        ({"tls_cert": "CERT", "tls_key": "CA"}, "server.tls_key: "),
        ({"tls_cert": "CERT", "tls_key": "STRANGER"}, "server.tls_key: cannot use"),
        ({"tls_client_ca": "CA"}, "server.tls_client_ca: requires server.tls_cert"),
        ({"tls_cert": "CERT", "tls_key": "KEY", "tls_client_ca": "KEY"}, "server.tls_client_ca"),
    ],
)
def test_config_errors_name_the_key(
    tmp_path: pathlib.Path, pki: Pki, server: dict[str, str], expected: str
) -> None:
    files = {
        "CERT": pki.cert,
        "KEY": pki.key,
        "CA": pki.ca,
        "STRANGER": pki.stranger,  # a key and certificate, but not the server's key
    }
    lines = [f'{k} = "{files.get(v, v)}"' for k, v in server.items()]
    path = tmp_path / "gateway.toml"
    path.write_text("[server]\n" + "\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert any(e.startswith(expected) for e in info.value.errors), info.value.errors
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_encrypted_key_is_refused_not_prompted_for(tmp_path: pathlib.Path, pki: Pki) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(ConfigError, match=r"server.tls_key: the key is encrypted"):
        Config.from_dict({"server": {"tls_cert": str(pki.cert), "tls_key": str(encrypted)}})


def test_client_tls_files_are_checked(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"tls_ca .*/absent\.pem"):
        client_ssl_context(str(tmp_path / "absent.pem"))


@pytest.mark.parametrize(
    ("token", "tls", "warning"),
    [
        ("", False, "ANYONE who can reach this port"),
        ("", True, "ANYONE who can reach this port"),
        (TOKEN, False, "clear text"),
        (TOKEN, True, None),
    ],
)
async def test_non_loopback_listen_warns(
    tmp_path: pathlib.Path,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
    token: str,
    tls: bool,
    warning: str | None,
) -> None:
    server = {"listen": "0.0.0.0:0", "token": token}
    if tls:
        server |= {"tls_cert": str(pki.cert), "tls_key": str(pki.key)}
    caplog.set_level(logging.WARNING, logger="gateway.server")
    async with served(make_config(tmp_path, server=server)):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warning is None:
        assert not warnings
    else:
        assert any(warning in w and "0.0.0.0:0" in w for w in warnings), warnings
        assert all(TOKEN not in w for w in warnings)


async def test_loopback_listen_does_not_warn(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.server")
    async with served(make_config(tmp_path)):
        pass
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- the command line against a real daemon ------------------------------------------


def _daemon_config(pki: Pki) -> str:
    return f'[server]\ntoken = "{TOKEN}"\ntls_cert = "{pki.cert}"\ntls_key = "{pki.key}"\n'


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("tls") / "node", _daemon_config(pki))
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def sg(
    daemon: Daemon, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEGMENT_GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", args[0], "--connect", daemon.address, *args[1:]],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env={**clean, **(env or {})},
    )


def test_cli_with_tls_ca_and_token(tls_daemon: Daemon, pki: Pki) -> None:
    auth = ("--token", TOKEN, "--tls-ca", str(pki.ca))
    r = sg(tls_daemon, "create", "cli/tls", *auth)
    assert r.returncode == 0, r.stderr
    lines = b"".join(f"line {i}\n".encode() for i in range(1000))
    r = sg(tls_daemon, "append", "cli/tls", *auth, stdin=lines)
    assert r.returncode == 0, r.stderr
    r = sg(tls_daemon, "cat", "cli/tls", *auth)
    assert r.returncode == 0 and r.stdout == lines, r.stderr
    # The CA and the token from the environment.
    env = {"SEGMENT_GATEWAY_TLS_CA": str(pki.ca), "SEGMENT_GATEWAY_TOKEN": TOKEN}
    r = sg(tls_daemon, "ls", "cli/", env=env)
    assert r.returncode == 0 and r.stdout.split() == [b"cli/tls"], r.stderr
    r = sg(tls_daemon, "ls", "--tls-server-name", "localhost", env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--token", TOKEN), 24, b"does it require TLS"),
        (("--token", TOKEN, "--tls"), 24, b"certificate is not trusted"),
        (("--token", TOKEN, "--tls-ca", "OTHER"), 24, b"certificate is not trusted"),
        (("--token", TOKEN, "--tls-ca", "CA", "--tls-server-name", "x.example"), 24,
         b"not valid for 'x.example'"),
        (("--token", TOKEN, "--tls-ca", "/nonexistent.pem"), 2, b"/nonexistent.pem"),
        (("--tls-ca", "CA"), 19, b"unauthorized"),
        (("--token", "not-the-token", "--tls-ca", "CA"), 19, b"unauthorized"),
    ],
)  # fmt: skip
def test_cli_refusals_are_one_line(
    tls_daemon: Daemon, pki: Pki, args: tuple[str, ...], code: int, message: bytes
) -> None:
    files = {"CA": str(pki.ca), "OTHER": str(pki.other_ca)}
    args = tuple(files.get(a, a) for a in args)
    for command in (("ls",), ("append", "cli/refused", "--create")):
        r = sg(tls_daemon, *command, *args, stdin=b"nope\n")
        assert r.returncode == code, r.stderr
        assert message in r.stderr, r.stderr
        assert b"Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    r = sg(tls_daemon, "stat", "cli/refused", "--token", TOKEN, "--tls-ca", str(pki.ca))
    assert r.returncode == 10, "nothing was applied"


def test_token_never_in_the_daemon_log(tls_daemon: Daemon, pki: Pki) -> None:
    ca = str(pki.ca)
    assert sg(tls_daemon, "ls", "--token", TOKEN[:-1] + "Z", "--tls-ca", ca).returncode == 19
    assert sg(tls_daemon, "ls", "--token", TOKEN).returncode == 24
    assert sg(tls_daemon, "create", "log/ok", "--token", TOKEN, "--tls-ca", ca).returncode == 0
    log = tls_daemon.log_path.read_text(errors="replace")
    assert "bad or missing token" in log and "TLS handshake failed" in log
    assert TOKEN not in log and TOKEN[:-1] not in log


def test_client_commands_need_not_read_the_daemons_key(
    tls_daemon: Daemon, pki: Pki, tmp_path: pathlib.Path
) -> None:
    # On a node, users run client commands with the daemon's configuration
    # (for listen and token) but cannot read its private key.
    unreadable = tmp_path / "no-access" / "key.pem"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nlisten = "{tls_daemon.address}"\ntoken = "{TOKEN}"\n'
        f'tls_cert = "{pki.cert}"\ntls_key = "{unreadable}"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "--config", str(config), "ls", "--tls-ca",
         str(pki.ca)],
        capture_output=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # The daemon's own checks still see it.
    with pytest.raises(ConfigError, match=r"server\.tls_key: cannot read"):
        Config.load(config)
    assert Config.load(config, check_files=False).server.token == TOKEN


def test_nodes_of_a_tls_cluster_talk_tls_to_each_other(tmp_path: pathlib.Path, pki: Pki) -> None:
    """Two TLS nodes on one Tier 2: each mount shows the other's tail, read over TLS."""
    require_fuse()
    shared = tmp_path / "tier2"
    config = (
        _daemon_config(pki)
        + f'[tier2]\nurl = "file://{shared}"\n'
        + f'[cluster]\nheartbeat_interval = "0.5s"\ndown_after = "3s"\ntls_ca = "{pki.ca}"\n'
    )
    a = MountedDaemon(tmp_path / "a", tmp_path / "a-mnt", config_text=config.replace(
        "[tier2]", '[node]\nid = "tls-a"\n[tier2]'))  # fmt: skip
    b = MountedDaemon(tmp_path / "b", tmp_path / "b-mnt", config_text=config.replace(
        "[tier2]", '[node]\nid = "tls-b"\n[tier2]'))  # fmt: skip
    try:
        a.start(timeout=60)
        b.start(timeout=60)
        with SyncClient(a.address, TOKEN, tls_ca=str(pki.ca)) as c:
            c.create("tls/seg")
            c.append("tls/seg", b"only in a's journal\n")
        seen = b.mnt / "tls/seg"
        wait_for(
            lambda: os.getxattr(seen, "user.segment.tail_available") == b"1",
            10,
            "a's tail available on b",
            detail=b.log,
        )
        assert seen.read_bytes() == b"only in a's journal\n"
        # Changes sent to b follow to a, over TLS.
        with SyncClient(b.address, TOKEN, tls_ca=str(pki.ca)) as c:
            assert c.append("tls/seg", b"via b\n").offset == 20
        assert "does not answer" not in b.log()
    finally:
        b.teardown()
        a.teardown()
