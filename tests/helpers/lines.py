"""Test helpers for ``lines`` events: the lines of some bytes found the plain way,
raw appends, and transactions committed in the background."""

from __future__ import annotations

import threading
from typing import Any

from gateway.client.sync import SyncClient


def line_rows(data: bytes, first: int = 0, final: bool = True) -> list[tuple[int, bytes]]:
    """(offset, line) of every line of ``data`` from ``first`` (a line start) on.

    ``final``: a last line without a newline counts (a sealed segment).
    """
    rows = []
    pos = first
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            if final:
                rows.append((pos, data[pos:]))
            break
        rows.append((pos, data[pos:nl]))
        pos = nl + 1
    return rows


def append_raw(c: SyncClient, name: str, data: bytes, piece: int = 64 * 1024) -> list[int]:
    """Append ``data`` in pieces of ``piece`` bytes (cut anywhere); their offsets."""
    return [c.append(name, data[i : i + piece]).offset for i in range(0, len(data), piece)]


class Committer(threading.Thread):
    """Commits transactions of ``per_txn`` lines ``t<n>-<j>`` to ``stream`` back to back
    until `stop`; `committed` counts them, `errors` holds what went wrong."""

    def __init__(self, address: str, stream: str, per_txn: int) -> None:
        super().__init__(daemon=True)
        self.address, self.stream, self.per_txn = address, stream, per_txn
        self.committed: list[int] = []
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with SyncClient(self.address) as c:
                n = 0
                while not self._stopping.is_set():
                    t = c.begin_transaction(self.stream)
                    for i in range(0, self.per_txn, 10):
                        lines = b"".join(b"t%05d-%02d\n" % (n, j) for j in range(i, i + 10))
                        c.append(t.name, lines)
                    c.commit_transaction(t.name)
                    n += 1
                    self.committed.append(n)
        except BaseException as e:
            self.errors.append(e)

    def stop(self, timeout: float = 60) -> None:
        """Stop after the transaction in progress, and wait for that."""
        self._stopping.set()
        self.join(timeout)

    def __enter__(self) -> Committer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
