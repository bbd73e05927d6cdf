"""The client commands of segment-gateway against a real daemon."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient

from .conftest import ROOT
from .helpers.daemon import Daemon

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("cli") / "node")
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def sg(daemon: Daemon, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", args[0], "--connect", daemon.address, *args[1:]],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )


def test_segment_lifecycle_from_the_command_line(daemon: Daemon) -> None:
    r = sg(daemon, "create", "cli/one")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "cli/one"

    r = sg(daemon, "append", "cli/one", stdin=b"alpha\nbeta\ngamma\n")
    assert r.returncode == 0, r.stderr
    assert b"appended 3 event(s)" in r.stderr and b"it is 17 bytes long now" in r.stderr

    r = sg(daemon, "append", "cli/framed", "--create", "--framed", stdin=b"ab\ncde\n")
    assert r.returncode == 0, r.stderr

    r = sg(daemon, "ls", "cli/")
    assert r.stdout.decode().split() == ["cli/framed", "cli/one"]
    r = sg(daemon, "ls", "-l", "cli/")
    assert b"17" in r.stdout and b"active" in r.stdout

    r = sg(daemon, "stat", "cli/one")
    doc = json.loads(r.stdout)
    assert (doc["length"], doc["event_count"], doc["sealed"]) == (17, 3, False)
    assert doc["attributes"]["00000000000000000000000000000001"] == 3

    r = sg(daemon, "truncate", "cli/one", "6")
    assert r.returncode == 0 and b"below 6" in r.stdout
    r = sg(daemon, "seal", "cli/one")
    assert r.returncode == 0 and b"sealed cli/one at length 17" in r.stdout

    r = sg(daemon, "flush", "cli/one")
    assert r.returncode == 0 and b"flushed cli/one" in r.stdout, r.stderr
    doc = json.loads(sg(daemon, "stat", "cli/one").stdout)
    assert doc["storage_length"] == 17 and doc["sealed_in_storage"] and doc["chunk_count"] == 1
    r = sg(daemon, "cat", "cli/one")
    assert r.stdout == b"beta\ngamma\n"  # from the start offset
    r = sg(daemon, "flush", "cli/nothing")
    assert r.returncode == 10 and b"does not exist" in r.stderr

    r = sg(daemon, "append", "cli/one", stdin=b"late\n")
    assert r.returncode == 12, r.stderr
    assert b"is sealed" in r.stderr and b"Traceback" not in r.stderr

    r = sg(daemon, "delete", "cli/framed")
    assert r.returncode == 0
    r = sg(daemon, "stat", "cli/framed")
    assert r.returncode == 10 and b"does not exist" in r.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("create", "bad name"), 16, b"invalid segment name"),
        (("create", "cli/dup"), 11, b"already exists"),
        (("seal", "cli/nope"), 10, b"does not exist"),
        (("truncate", "cli/dup", "5"), 13, b"outside"),
    ],
)
def test_errors_have_codes(
    daemon: Daemon, args: tuple[str, ...], code: int, message: bytes
) -> None:
    sg(daemon, "create", "cli/dup")
    r = sg(daemon, *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert b"Traceback" not in r.stderr


def test_cannot_connect(tmp_path: pathlib.Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "ls", "--connect", "127.0.0.1:1"],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 24
    assert b"cannot connect" in r.stderr


def test_append_from_a_file_lands_byte_for_byte(daemon: Daemon, tmp_path: pathlib.Path) -> None:
    src = tmp_path / "input.txt"
    lines = [f"line {i} {'x' * (i % 50)}" for i in range(5000)]
    src.write_text("\n".join(lines) + "\n")
    r = sg(daemon, "append", "cli/file", "--create", "--file", str(src))
    assert r.returncode == 0, r.stderr
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(range(256)) * 1000)
    r = sg(daemon, "append", "cli/raw", "--create", "--raw", "--file", str(raw))
    assert r.returncode == 0, r.stderr
    with SyncClient(daemon.address) as c:
        assert c.read("cli/file", 0, 1 << 26).data == src.read_bytes()
        assert c.read("cli/raw", 0, 1 << 26).data == raw.read_bytes()
