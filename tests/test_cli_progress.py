"""Progress of the long commands: drawn when stderr is a terminal (a real
pseudo-terminal here, from the pty module), never when it is a pipe or with
--quiet, against one real daemon."""

from __future__ import annotations

import fcntl
import os
import pathlib
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from typing import IO

import pytest

from .conftest import ROOT
from .helpers.daemon import Daemon

pytestmark = pytest.mark.slow

MiB = 1 << 20
#: The file appended: three raw appends of at most 4 MiB.
SIZE = 10 * MiB


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("cli-progress") / "node")
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def on_terminal(*args: str, stdout: IO[bytes] | int = subprocess.DEVNULL) -> tuple[int, str]:
    """Run ``segment-gateway ARGS`` with stderr on a pseudo-terminal (120 columns);
    its exit code and what it wrote there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", *args],
        stdin=subprocess.DEVNULL, stdout=stdout, stderr=slave, cwd=ROOT,
    )  # fmt: skip
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=30), out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def in_a_pipe(*args: str) -> tuple[int, str]:
    """The same with stderr (and stdout) a pipe."""
    r = subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                       timeout=90, cwd=ROOT)  # fmt: skip
    return r.returncode, r.stderr.decode(errors="replace")


def bar_of(text: str) -> bool:
    """Whether ``text`` holds a drawn bar of bytes with a total (tqdm: ``NN%|...| a/b``)."""
    return "%|" in text and "B/s]" in text


@pytest.mark.timeout(240)
def test_long_commands_draw_progress_on_a_terminal_only(
    daemon: Daemon, tmp_path: pathlib.Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(SIZE))
    at = ("--connect", daemon.address)

    # append --file: the input's bytes stored, against its size.
    code, tty = on_terminal("append", *at, "--raw", "--create", "--file", str(src), "p/a")
    assert code == 0, tty
    assert bar_of(tty) and "append p/a:" in tty and "/10.5M" in tty, tty
    assert "appended 3 event(s), 10485760 bytes, to p/a" in tty
    code, tty = on_terminal("append", *at, "--raw", "--quiet", "--file", str(src), "p/a")
    assert code == 0 and "%|" not in tty and "appended 3 event(s)" in tty, tty
    code, piped = in_a_pipe("append", *at, "--raw", "--file", str(src), "p/a")
    assert code == 0 and piped.count("\n") == 1 and piped.startswith("appended 3 event"), piped

    # flush: what was unflushed, against what is left (the label at least: a
    # flush to a local directory may be over before the first look).
    code, tty = on_terminal("flush", *at)
    assert code == 0 and "flush every segment" in tty, tty
    code, piped = in_a_pipe("flush", *at)
    assert code == 0 and piped == "", piped

    # cat to a file: the segment's bytes, against its length.
    with (tmp_path / "copy").open("wb") as copy:
        code, tty = on_terminal("cat", *at, "p/a", stdout=copy)
    assert code == 0 and bar_of(tty) and "cat p/a:" in tty and "/31.5M" in tty, tty
    assert (tmp_path / "copy").read_bytes() == src.read_bytes() * 3
    code, piped = in_a_pipe("cat", *at, "p/a")
    assert code == 0 and piped == "", piped

    # fsck --deep through the daemon: every chunk read.
    code, tty = on_terminal("fsck", "--deep", *at)
    assert code == 0 and bar_of(tty) and "chunk-data:" in tty, tty
    code, piped = in_a_pipe("fsck", "--deep", *at)
    assert code == 0 and "chunk-data:" not in piped and "%|" not in piped, piped

    # export-metadata and import-metadata: each step named, with the time taken.
    out = tmp_path / "meta.pb"
    code, tty = on_terminal("export-metadata", *at, "--out", str(out))
    assert code == 0 and "export-metadata: the daemon builds the snapshot [00:0" in tty, tty
    assert "exported node 'node-1'" in tty
    code, tty = on_terminal("--config", str(daemon.config_path), "import-metadata", str(out),
                            "--data-dir", str(tmp_path / "new-node"))  # fmt: skip
    assert code == 0, tty
    assert "import-metadata: checking 1 segment(s) against Tier 2 and installing them" in tty
