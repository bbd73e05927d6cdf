"""The systemd notify protocol (sd_notify(3)), spoken directly: a datagram per message.

systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract
socket) to a ``Type=notify`` service; the service sends newline-separated
``KEY=VALUE`` lines: ``READY=1`` once it serves, ``STATUS=...`` for
``systemctl status``, ``WATCHDOG=1`` at least every ``WATCHDOG_USEC``
microseconds (when ``WatchdogSec`` is set), ``RELOADING=1`` / ``READY=1``
around a reload, ``STOPPING=1`` when it begins to stop. Outside systemd
(no ``NOTIFY_SOCKET``) every call does nothing.

Sends never block the event loop: the socket is non-blocking, and a message
that does not fit the receiver's queue is dropped (systemd reads it
promptly; a lost STATUS is harmless, a lost WATCHDOG is re-sent next
period).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends notify messages to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        self._sock: socket.socket | None = None
        if path.startswith("@"):
            self._address = b"\0" + path[1:].encode()  # abstract namespace
        elif path.startswith("/"):
            self._address = path
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)
        #: Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None.
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 2e6
        self.sent = 0

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens."""
        return self._sock is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` fields as one message; False if it could not be sent."""
        if self._sock is None or self._address is None:
            return False
        try:
            self._sock.sendto("\n".join(fields).encode(), self._address)
        except OSError as e:
            log.debug("sd_notify %s: %s", fields, e)
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        """READY=1 (with a status line)."""
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """STATUS=text."""
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the event loop is alive."""
        return self.notify("WATCHDOG=1")

    def reloading(self) -> bool:
        """RELOADING=1, with the MONOTONIC_USEC newer systemd versions ask for."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str = "") -> bool:
        """STOPPING=1."""
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
