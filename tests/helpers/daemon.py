"""A real `segment-gateway serve` process for tests: start, kill, restart."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence

from tests.helpers.wait import wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


#: Every port `free_port` has handed out in this process.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, never one handed out before.

    The kernel may give the port it just gave again once it is closed: a
    daemon's server and metrics ports, picked one after the other, were the
    same once (its configuration refused to start).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


#: Every Daemon made since the current test started (tests/conftest.py clears it).
STARTED: list[Daemon] = []


class Daemon:
    """One daemon process on a fixed port, so it can be killed and restarted in place."""

    def __init__(
        self,
        data_dir: pathlib.Path,
        config_text: str = "",
        port: int = 0,
        env: dict[str, str] | None = None,
        mountpoint: pathlib.Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        #: The address it serves the protocol and its metrics on.
        self.host = host
        #: Put before the command line, e.g. ``("ip", "netns", "exec", NAME)``
        #: to run it in a network namespace.
        self.command_prefix = tuple(command_prefix)
        #: Run in the child before exec (e.g. to lower its resource limits).
        self.preexec_fn = preexec_fn
        #: Where it mounts the segments (None: no mount).
        self.mountpoint = mountpoint
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = data_dir / "gateway.toml"
        if "[tier2]" not in config_text:
            # The filesystem binding: no S3 server to start for every daemon.
            config_text += f'\n[tier2]\nurl = "file://{data_dir}/tier2"\n'
        self.config_path.write_text(config_text)
        self.env = env or {}
        self.port = port or free_port()
        self.address = f"{host}:{self.port}"
        self.metrics_port = free_port()
        self.ready_file = data_dir / "ready"
        self.log_path = data_dir / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # Its log is checked for unexpected ERROR lines when the test ends
        # (tests/conftest.py, check_error_logs).
        STARTED.append(self)

    def start(self, timeout: float = 30.0, serve_args: tuple[str, ...] = ()) -> None:
        """Start and wait until it serves (its ready file appears).

        ``serve_args`` are added to the ``serve`` command line (e.g.
        ``--recover-from-tier2``).
        """
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.ready_file.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                *self.command_prefix,
                sys.executable, "-m", "gateway.cli", "--config", str(self.config_path),
                "serve", "--data-dir", str(self.data_dir), "--listen", self.address,
                "--ready-file", str(self.ready_file),
                "--mountpoint", str(self.mountpoint or ""),
                "--metrics-listen", f"{self.host}:{self.metrics_port}", *serve_args,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self.preexec_fn,
        )  # fmt: skip
        log.close()
        self.starts += 1
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}:\n{self.log()}")
            return self.ready_file.exists()

        try:
            wait_for(ready, timeout, "daemon ready", interval=0.01)
        except AssertionError:
            self.kill()
            raise RuntimeError(f"daemon not ready after {timeout}s:\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def error_lines(self) -> list[str]:
        """The log's ERROR and CRITICAL lines, and the first line of each traceback."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [
            line
            for line in text.splitlines()
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        ]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Every sample of a daemon's /metrics by name and labels, e.g. ``x{state="up"}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def run_cli(
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``segment-gateway ARGS...`` from this checkout, as text, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
