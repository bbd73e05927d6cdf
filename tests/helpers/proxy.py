"""A loopback TCP proxy that can cut connections, for fault-injection tests."""

from __future__ import annotations

import random

import trio


async def _connect(port: int) -> trio.SocketStream:
    """Connect to a loopback port; the socket is closed on any failure or cancellation.

    (trio.open_tcp_stream cancelled right after connecting can leave its
    winning socket to the garbage collector.)
    """
    sock = trio.socket.socket()
    try:
        await sock.connect(("127.0.0.1", port))
        # SocketStream sets options, which fails if the peer died meanwhile.
        return trio.SocketStream(sock)
    except BaseException:
        sock.close()
        raise


class DroppingProxy:
    """Forwards ``listen`` -> ``upstream``; `drop_all` cuts every connection.

    With ``drop_after`` = (lo, hi), each connection is also cut by itself
    after a random lifetime in that range (seconds). While ``muted``, what
    the upstream sends is discarded (requests still go through): an answer
    "lost" after the server acted on its request.
    """

    def __init__(
        self,
        upstream_port: int,
        drop_after: tuple[float, float] | None = None,
        seed: int = 0,
    ) -> None:
        self.upstream_port = upstream_port
        self.drop_after = drop_after
        self.rng = random.Random(seed)
        self.port = 0
        self.drops = 0
        self.connections = 0
        self.muted = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    def drop_all(self) -> None:
        for scope in list(self._scopes):
            scope.cancel()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        upstream: trio.SocketStream | None = None
        scope = trio.CancelScope()
        if self.drop_after:
            scope.deadline = trio.current_time() + self.rng.uniform(*self.drop_after)
        self._scopes.add(scope)
        try:
            with scope:
                try:
                    upstream = await _connect(self.upstream_port)
                except OSError:
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope, False)
                    nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope, True)
            if scope.cancelled_caught:
                self.drops += 1
        finally:
            # Closed synchronously: an await here could be cancelled and skip one.
            self._scopes.discard(scope)
            client.socket.close()
            if upstream is not None:
                upstream.socket.close()

    async def _pump(
        self, src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope, replies: bool
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                if replies and self.muted:
                    continue
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()
