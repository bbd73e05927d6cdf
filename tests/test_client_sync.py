"""The blocking client is derived from the async one: every request, same signature."""

from __future__ import annotations

import inspect

from gateway.client.client import Client
from gateway.client.sync import SyncClient, blocking_requests

#: The blocking calls that tests, benches and the pipeline use (the hand-written
#: list before the client was derived): each must stay.
USED = {
    "create", "append", "seal", "flush", "truncate", "delete", "export_metadata", "info",
    "list", "read", "get_attributes", "attribute_range", "update_attributes",
    "create_stream", "set_stream", "stream", "roll_stream", "delete_stream",
    "begin_transaction", "commit_transaction", "abort_transaction",
}  # fmt: skip


def test_every_request_of_the_async_client_has_a_blocking_form() -> None:
    names = blocking_requests()
    assert set(names) >= USED
    for name in names:
        blocking = getattr(SyncClient, name)
        assert not inspect.iscoroutinefunction(blocking), name
        assert inspect.signature(blocking) == inspect.signature(getattr(Client, name)), name
        assert blocking.__qualname__ == f"SyncClient.{name}"
        assert (blocking.__doc__ or "").startswith(f"`Client.{name}`, blocking."), name


def test_what_lives_on_the_loop_has_no_blocking_form() -> None:
    """A future to await on the client's loop, or an async iterator, would not work here."""
    for name in ("start", "start_append", "aclose", "read_pieces", "fsck", "iter_attributes"):
        assert not hasattr(SyncClient, name), name
