"""A fault-injecting HTTP/1.1 proxy in front of an S3 endpoint, for retry tests.

`S3FaultProxy` listens on a free loopback port (its `endpoint_url` goes to
the S3 binding instead of the server's) and forwards each request to the
upstream endpoint, in a background thread per client connection. Keep-alive
works: requests are parsed one by one (request line, headers, a body by
Content-Length or chunked) and each client connection keeps its own upstream
connection. On command it disturbs requests instead:

- ``fail(n)``: answer with an S3 error (by default ``503 SlowDown``, a proper
  XML error body, optionally a ``Retry-After`` header) without forwarding;
- ``drop(n, when="request")``: close the connection (with a reset) after
  reading the request head, before forwarding anything;
- ``drop(n, when="response")``: forward, pass on the response head and half
  of its body, then reset the connection;
- ``delay(n, seconds)``: wait before forwarding.

Each rule applies to the next ``n`` matching requests (``n=None``: until
`clear`), optionally only with a given HTTP method, and with a probability
(``fraction``). `set_upstream` repoints the proxy (e.g. at a closed port: an
outage, seen by clients as connections reset). Counters: `requests`,
`forwarded`, and per kind in `injected`.
"""

from __future__ import annotations

import collections
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal
from urllib.parse import urlsplit

Kind = Literal["error", "drop_request", "drop_response", "delay"]

_MAX_HEAD = 64 * 1024
_COPY_BLOCK = 256 * 1024


@dataclass
class _Rule:
    kind: Kind
    remaining: int | None
    method: str | None
    fraction: float
    status: int = 503
    code: str = "SlowDown"
    retry_after: float | None = None
    seconds: float = 0.0


@dataclass
class _Head:
    start_line: bytes
    headers: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def encode(self) -> bytes:
        lines = [self.start_line] + [k + b": " + v for k, v in self.headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"


class _Closed(Exception):
    """The peer closed the connection."""


def _read_head(f: BinaryIO) -> _Head | None:
    """A request or response head; None at a clean end of the connection."""
    first = f.readline(_MAX_HEAD)
    if not first:
        return None
    if not first.endswith(b"\r\n"):
        raise _Closed("truncated head")
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = f.readline(_MAX_HEAD)
        if not line.endswith(b"\r\n"):
            raise _Closed("truncated head")
        if line == b"\r\n":
            break
        key, _, value = line[:-2].partition(b":")
        headers.append((key.strip(), value.strip()))
    return _Head(first[:-2], headers)


def _read_body(f: BinaryIO, head: _Head) -> bytes:
    """The body after ``head``, as it was on the wire (chunked stays chunked)."""
    te = head.get(b"transfer-encoding")
    if te is not None and b"chunked" in te.lower():
        out = bytearray()
        while True:
            size_line = f.readline(_MAX_HEAD)
            if not size_line.endswith(b"\r\n"):
                raise _Closed("truncated chunk")
            out += size_line
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    line = f.readline(_MAX_HEAD)
                    if not line.endswith(b"\r\n"):
                        raise _Closed("truncated trailer")
                    out += line
                    if line == b"\r\n":
                        return bytes(out)
            chunk = f.read(size + 2)
            if len(chunk) != size + 2:
                raise _Closed("truncated chunk")
            out += chunk
    length = int(head.get(b"content-length") or b"0")
    body = f.read(length)
    if len(body) != length:
        raise _Closed("truncated body")
    return body


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed peer or a middlebox would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _error_response(rule: _Rule, resource: str) -> bytes:
    reason = {503: "Service Unavailable", 500: "Internal Server Error", 429: "Too Many Requests"}
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{rule.code}</Code><Message>injected by S3FaultProxy</Message>"
        f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>"
    ).encode()
    headers = [
        f"HTTP/1.1 {rule.status} {reason.get(rule.status, 'Error')}",
        "Content-Type: application/xml",
        f"Content-Length: {len(body)}",
        "x-amz-request-id: fault-proxy",
    ]
    if rule.retry_after is not None:
        headers.append(f"Retry-After: {rule.retry_after:g}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


class S3FaultProxy:
    """Forwards HTTP/1.1 from a loopback port to an S3 endpoint, injecting faults."""

    def __init__(self, upstream_url: str, *, seed: int = 0) -> None:
        """A proxy for ``upstream_url`` (``http://host:port``); `start` it before use."""
        #: What it was made for (to repoint it back after an outage).
        self.original_upstream = upstream_url
        self.set_upstream(upstream_url)
        self._rng = random.Random(seed)
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._stopping = threading.Event()
        self.port = 0
        #: Requests received (complete heads).
        self.requests = 0
        #: Requests passed on upstream.
        self.forwarded = 0
        #: Faults injected, by kind.
        self.injected: collections.Counter[str] = collections.Counter()

    # -- life cycle ---------------------------------------------------------------

    def start(self) -> S3FaultProxy:
        """Listen on a free loopback port and serve in background threads."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, listener)
        return self

    def stop(self) -> None:
        """Close every connection and wait for the threads."""
        self._stopping.set()
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the proxy."""
        return f"http://127.0.0.1:{self.port}"

    # -- commands -----------------------------------------------------------------

    def set_upstream(self, upstream_url: str) -> None:
        """Forward new connections to ``upstream_url`` from now on."""
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://HOST:PORT, got {upstream_url!r}")
        self.upstream = (parts.hostname, parts.port)

    def fail(
        self,
        count: int | None = 1,
        *,
        method: str | None = None,
        fraction: float = 1.0,
        status: int = 503,
        code: str = "SlowDown",
        retry_after: float | None = None,
    ) -> None:
        """Answer matching requests with an S3 error instead of forwarding them."""
        self._add(_Rule("error", count, method, fraction, status, code, retry_after))

    def drop(
        self,
        count: int | None = 1,
        *,
        when: Literal["request", "response"] = "request",
        method: str | None = None,
        fraction: float = 1.0,
    ) -> None:
        """Reset matching connections before forwarding, or half-way through the response."""
        kind: Kind = "drop_request" if when == "request" else "drop_response"
        self._add(_Rule(kind, count, method, fraction))

    def delay(
        self,
        count: int | None,
        seconds: float,
        *,
        method: str | None = None,
        fraction: float = 1.0,
    ) -> None:
        """Wait ``seconds`` before forwarding matching requests."""
        self._add(_Rule("delay", count, method, fraction, seconds=seconds))

    def clear(self) -> None:
        """Forget every rule: forward everything again."""
        with self._lock:
            self._rules.clear()

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _match(self, method: str) -> _Rule | None:
        """The first rule for this request (consuming one of its uses), if any."""
        with self._lock:
            self.requests += 1
            for rule in self._rules:
                if rule.method is not None and rule.method != method:
                    continue
                if rule.remaining is not None and rule.remaining <= 0:
                    continue
                if rule.fraction < 1.0 and self._rng.random() >= rule.fraction:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                self.injected[rule.kind] += 1
                return rule
            return None

    # -- serving ------------------------------------------------------------------

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._spawn(self._serve, client)

    @contextlib.contextmanager
    def _tracked(self, sock: socket.socket) -> Iterator[socket.socket]:
        with self._lock:
            self._open.add(sock)
        try:
            yield sock
        finally:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, client: socket.socket) -> None:
        """One client connection: requests in order, each forwarded or disturbed."""
        upstream: socket.socket | None = None
        upstream_file: BinaryIO | None = None
        with self._tracked(client), client.makefile("rb") as cf:
            try:
                while not self._stopping.is_set():
                    head = _read_head(cf)
                    if head is None:
                        return
                    method, target = head.start_line.decode("latin-1").split(" ")[:2]
                    rule = self._match(method)
                    if rule is not None and rule.kind == "drop_request":
                        _reset(client)
                        return
                    expect = head.get(b"expect")
                    if expect is not None and expect.lower() == b"100-continue":
                        # botocore asks before large uploads; we answer for
                        # the upstream, which then gets the body at once.
                        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                        head.headers = [h for h in head.headers if h[0].lower() != b"expect"]
                    body = _read_body(cf, head)
                    if rule is not None and rule.kind == "error":
                        client.sendall(_error_response(rule, target))
                        continue
                    if rule is not None and rule.kind == "delay":
                        time.sleep(rule.seconds)
                    if upstream is None or upstream_file is None:
                        try:
                            upstream = socket.create_connection(self.upstream, timeout=5)
                        except OSError:
                            # Upstream down: the client sees its connection reset.
                            _reset(client)
                            return
                        upstream.settimeout(None)
                        with self._lock:
                            self._open.add(upstream)
                        upstream_file = upstream.makefile("rb")
                    upstream.sendall(head.encode() + body)
                    with self._lock:
                        self.forwarded += 1
                    if not self._relay(client, upstream_file, head, method, rule):
                        return
            except (OSError, _Closed, ValueError):
                return
            finally:
                if upstream_file is not None:
                    upstream_file.close()
                if upstream is not None:
                    with self._lock:
                        self._open.discard(upstream)
                    with contextlib.suppress(OSError):
                        upstream.close()

    def _relay(
        self,
        client: socket.socket,
        uf: BinaryIO,
        request: _Head,
        method: str,
        rule: _Rule | None,
    ) -> bool:
        """Pass one response from upstream to the client; whether to keep the connection."""
        while True:
            response = _read_head(uf)
            if response is None:
                raise _Closed("upstream closed")
            status = int(response.start_line.split(b" ")[1])
            if not 100 <= status < 200:
                break  # interim answers (100 Continue) are not passed on
        no_body = method == "HEAD" or status in (204, 304)
        length_text = response.get(b"content-length")
        chunked = b"chunked" in (response.get(b"transfer-encoding") or b"").lower()
        head_bytes = response.encode()
        if rule is not None and rule.kind == "drop_response":
            if no_body:
                payload = b""
            elif chunked:
                payload = _read_body(uf, response)
            else:
                payload = uf.read(int(length_text or b"0"))
            # Half of the body, or half of the head when there is no body.
            cut = len(head_bytes) + len(payload) // 2 if payload else len(head_bytes) // 2
            client.sendall((head_bytes + payload)[:cut])
            _reset(client)
            return False
        client.sendall(head_bytes)
        if no_body:
            pass
        elif chunked:
            client.sendall(_read_body(uf, response))
        elif length_text is not None:
            left = int(length_text)
            while left:
                block = uf.read(min(left, _COPY_BLOCK))
                if not block:
                    raise _Closed("upstream body cut")
                client.sendall(block)
                left -= len(block)
        else:  # delimited by the end of the connection
            while block := uf.read(_COPY_BLOCK):
                client.sendall(block)
            return False
        closing = (
            b"close"
            in ((request.get(b"connection") or b"") + (response.get(b"connection") or b"")).lower()
        )
        return not closing
