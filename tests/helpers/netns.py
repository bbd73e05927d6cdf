"""Real network partitions for tests: a network namespace, a veth pair, nft drops.

`NetNamespace` makes a namespace joined to the root namespace by a veth
pair (``10.231.N.1`` on the root side, ``10.231.N.2`` inside); a daemon runs
inside by prefixing its command with `NetNamespace.exec_prefix`, and talks to
the root namespace through the root side's address (the root namespace's
loopback is out of its reach: `TcpRelay` brings a loopback-only server, such
as the session's SeaweedFS, to that address). `NetNamespace.cut` drops, with
nftables inside the namespace, every packet between the namespace and the
root side's address (but TCP to the ports it allows, e.g. S3's), in both
directions, silently, as a pulled cable does; `NetNamespace.heal` removes
the rules.
A test reaches the namespace without crossing the cut through a `TcpRelay`
on loopback whose connections come from `NetNamespace.client_ip`.
`close` deletes the namespace, which takes its veth pair and rules with it.

Needs root, ``ip`` and ``nft`` (Debian's nftables; scripts/bootstrap.sh
installs it): `unavailable` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterable

#: Namespace names: PREFIX<pid>-<n>, so a later run can delete those of a dead run.
PREFIX = "sgpart"
TABLE = "sg_partition"


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why namespaces with nft drops cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: {package})"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        r = _run("ip", "netns", "add", name, check=False)
        if r.returncode != 0:
            return f"`ip netns add` failed: {r.stderr.strip()}"
        r = _run("ip", "netns", "exec", name, "nft", "add", "table", "inet", TABLE, check=False)
        if r.returncode != 0:
            return f"nftables does not work in a namespace: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


def sweep_stale() -> None:
    """Delete the namespaces of test runs whose process is gone (killed before teardown)."""
    r = _run("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line)
        if m is None:
            continue
        try:
            os.kill(int(m.group(2)), 0)
        except ProcessLookupError:
            _run("ip", "netns", "del", m.group(1), check=False)
        except PermissionError:
            pass


class NetNamespace:
    """A network namespace joined to the root namespace by a veth pair."""

    _count = 0

    def __init__(self) -> None:
        NetNamespace._count += 1
        n = NetNamespace._count
        self.name = f"{PREFIX}{os.getpid()}-{n}"
        # Interface names have at most 15 characters.
        tag = f"{os.getpid() % 100000}{n % 100:02d}"
        self.host_if = f"sgh{tag}"
        self.ns_if = f"sgn{tag}"
        subnet = self._free_subnet()
        #: The root side's address (the namespace reaches the root namespace here).
        self.host_ip = f"10.231.{subnet}.1"
        #: The namespace's address.
        self.ns_ip = f"10.231.{subnet}.2"
        #: A second root-side address, never cut: a test's own path to the
        #: namespace (`TcpRelay` with ``source=client_ip``).
        self.client_ip = f"10.231.{subnet}.3"
        self._made = False

    @staticmethod
    def _free_subnet() -> int:
        used = set(re.findall(r"inet 10\.231\.(\d+)\.", _run("ip", "-4", "addr").stdout))
        # Starting from the pid: two test runs at once rarely race for one.
        first = os.getpid() % 254
        for k in range(254):
            i = 1 + (first + k) % 254
            if str(i) not in used:
                return i
        raise RuntimeError("no free 10.231.N.0/24 subnet")

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        """What to put before a command to run it inside the namespace."""
        return ("ip", "netns", "exec", self.name)

    def open(self) -> NetNamespace:
        """Make the namespace, the veth pair and the addresses; bring them up."""
        self._made = True
        try:
            _run("ip", "netns", "add", self.name)
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _run("ip", "link", "set", self.ns_if, "netns", self.name)
            # The first address is the one the root namespace connects from.
            _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            _run("ip", "addr", "add", f"{self.client_ip}/24", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            self.exec("ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
            self.exec("ip", "link", "set", self.ns_if, "up")
            self.exec("ip", "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"{' '.join(e.cmd)}: {e.stderr.strip()}") from None
        return self

    def exec(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace (an error if it fails)."""
        return _run(*self.exec_prefix, *args)

    def cut(self, allow_ports: Iterable[int] = ()) -> None:
        """Drop every packet between the namespace and `host_ip`, but TCP to ``allow_ports``.

        Both directions: connections the namespace opens to `host_ip` (but to
        ``allow_ports`` there) and connections opened from `host_ip` (what
        the root namespace's processes use by default) to the namespace.
        Traffic with `client_ip` goes on. Replaces the previous cut.
        Established connections stay open and go silent; new ones time out.
        """
        allow = ", ".join(str(p) for p in sorted(set(allow_ports)))
        out_ok = f"ip daddr {self.host_ip} tcp dport {{ {allow} }} accept;" if allow else ""
        in_ok = f"ip saddr {self.host_ip} tcp sport {{ {allow} }} accept;" if allow else ""
        rules = f"""
table inet {TABLE} {{
    chain output {{
        type filter hook output priority 0; policy accept;
        {out_ok}
        ip daddr {self.host_ip} drop;
    }}
    chain input {{
        type filter hook input priority 0; policy accept;
        {in_ok}
        ip saddr {self.host_ip} drop;
    }}
}}
"""
        self.heal()
        r = subprocess.run(
            [*self.exec_prefix, "nft", "-f", "-"],
            input=rules,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode != 0:
            raise RuntimeError(f"nft: {r.stderr.strip()}")

    def rules(self) -> str:
        """The namespace's nftables ruleset, as ``nft list ruleset`` shows it."""
        return self.exec("nft", "list", "ruleset").stdout

    def heal(self) -> None:
        """Remove the cut (nothing if there is none)."""
        _run(*self.exec_prefix, "nft", "delete", "table", "inet", TABLE, check=False)

    def close(self) -> None:
        """Delete the namespace (its veth pair and rules go with it)."""
        if not self._made:
            return
        self._made = False
        _run("ip", "netns", "del", self.name, check=False)
        # Gone with the namespace's end of the pair; only if that was never moved.
        if self.host_if in _run("ip", "-o", "link", "show", check=False).stdout:
            _run("ip", "link", "del", self.host_if, check=False)

    def __enter__(self) -> NetNamespace:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpRelay:
    """Forwards TCP connections from ``(host, a free port)`` to ``upstream``, byte for byte.

    ``source``: the address its upstream connections come from.
    """

    def __init__(self, host: str, upstream: tuple[str, int], source: str | None = None) -> None:
        self.upstream = upstream
        self.source = source
        self._listener = socket.create_server((host, 0))
        self.host = host
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(
                    self.upstream, timeout=10, source_address=(self.source or "", 0)
                )
                up.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    up.close()
                    return
                self._open |= {conn, up}
            done = threading.Semaphore(0)
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_RDWR)
        # The second direction to end closes the pair.
        if done.acquire(blocking=False):
            with self._lock:
                self._open -= {src, dst}
            src.close()
            dst.close()
        else:
            done.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._open)
            self._open.clear()
        self._listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
