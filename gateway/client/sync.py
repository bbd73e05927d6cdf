"""The blocking client: every request of the async `Client`, run on a trio loop in a thread.

`SyncClient` is derived from `Client` rather than written beside it: each
public coroutine method of `Client` becomes a blocking method of the same
name, signature and docstring that runs it on the client's loop
(`trio.from_thread.run`), so a request added to `Client` is a blocking call
too without a line here. Left out are the coroutines whose answer lives on
the loop (`_LOOP_ONLY`) and the async iterators (`Client.read_pieces`,
`Client.fsck`, `Client.iter_attributes`; `read` and `attribute_range` are
their blocking forms).
"""

from __future__ import annotations

import functools
import inspect
import ssl
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import trio

from gateway.client.client import Client, open_client
from gateway.errors import ConnectionLost

#: Coroutine methods of `Client` that get no blocking form: `start` and
#: `start_append` return a future to await on the client's loop, and `close`
#: does what `aclose` does.
_LOOP_ONLY = frozenset({"start", "start_append", "aclose"})


class SyncClient:
    """A blocking client: the async `Client` on a trio loop in a background thread.

    Every request of `Client` is a method here that blocks until it is
    answered (see the module's docstring for the few that are not)::

        with SyncClient("127.0.0.1:9410") as c:
            c.create("logs/app")
            c.append("logs/app", b"line\\n")
    """

    def __init__(
        self,
        address: str,
        token: str = "",
        *,
        ssl_context: ssl.SSLContext | None = None,
        tls_ca: str | None = None,
        server_hostname: str | None = None,
    ) -> None:
        """Connect (TLS keywords as in `open_client`); errors raise here."""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        connect = functools.partial(
            open_client,
            address,
            token,
            ssl_context=ssl_context,
            tls_ca=tls_ca,
            server_hostname=server_hostname,
        )
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, connect), daemon=True, name="gateway-client"
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, connect: Callable[[], AbstractAsyncContextManager[Client]]) -> None:
        try:
            async with connect() as client:
                self._client = client
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self._error = e
        finally:
            self._ready.set()

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``Client.<name>(*args, **kwargs)`` on the client's loop; its answer."""
        if self._token is None:
            raise ConnectionLost("?", "the client is closed")
        assert self._client is not None
        method = getattr(self._client, name)
        return trio.from_thread.run(
            functools.partial(method, *args, **kwargs), trio_token=self._token
        )

    def close(self) -> None:
        """Disconnect and stop the background thread."""
        token, self._token = self._token, None
        if token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=token)
        self._thread.join()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    if TYPE_CHECKING:
        # The requests are added below, from `Client`: a type checker sees
        # them as attributes of unknown type.
        def __getattr__(self, name: str) -> Any: ...


def _blocking(name: str, request: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """The blocking form of the `Client` method ``request``: same name, signature and doc."""

    @functools.wraps(request)
    def call(self: SyncClient, *args: Any, **kwargs: Any) -> Any:
        return self._run(name, *args, **kwargs)

    call.__module__ = __name__
    call.__qualname__ = f"SyncClient.{name}"
    call.__doc__ = f"`Client.{name}`, blocking.\n\n{inspect.getdoc(request) or ''}".rstrip()
    return call


def blocking_requests() -> list[str]:
    """The names of the `Client` methods that `SyncClient` has a blocking form of."""
    return sorted(
        name
        for name, member in inspect.getmembers(Client, inspect.iscoroutinefunction)
        if not name.startswith("_") and name not in _LOOP_ONLY
    )


for _name in blocking_requests():
    setattr(SyncClient, _name, _blocking(_name, getattr(Client, _name)))
del _name
