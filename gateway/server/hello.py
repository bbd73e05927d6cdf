"""The handshake of a connection: Hello, the protocol version and the token.

With ``server.token`` the first request must be a Hello carrying it
(compared in constant time); nothing else is read before that. With or
without a token, the Hello must come within HANDSHAKE_TIMEOUT and be small
(MAX_HELLO_BYTES), so unauthenticated peers cannot hoard connection slots
or memory (docs/SECURITY.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import TYPE_CHECKING

import trio

from gateway import __version__
from gateway.errors import Unauthorized, Unsupported
from gateway.protocol import wire_pb2 as wire

from .answers import Item, error_item, ready

if TYPE_CHECKING:
    from .context import Peer

log = logging.getLogger(__name__)

PROTOCOL_VERSION = wire.PROTOCOL_VERSION_1
#: Request kinds served beyond version 1's first set (HelloResponse.features):
#: a client asks for one only if the server names it, so that it works with
#: servers from before it (an unknown kind closes the connection).
FEATURES = ("changes", "status")
#: Seconds a client has to complete the TLS handshake, and then to send Hello.
HANDSHAKE_TIMEOUT = 10.0
#: The first message (Hello) may be at most this large, whatever max_message_bytes says.
MAX_HELLO_BYTES = 64 * 1024


def token_matches(given: str, token: str) -> bool:
    """Compare in constant time.

    Hashing first makes the time independent of the lengths too
    (`hmac.compare_digest` returns early when they differ).
    """
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(token.encode()).digest()
    )


async def receive_hello(conn: Peer) -> bytes | bytearray | None:
    """The first message: small, and within the handshake deadline.

    Until a client has said Hello (with the token) it may hold neither a
    connection slot for long nor much memory: otherwise anyone who can
    reach the port could fill server.max_connections with idle sockets
    or make the server buffer max_message_bytes each.
    """
    messages = conn.messages
    limit = messages.max_message_bytes
    messages.max_message_bytes = min(limit, MAX_HELLO_BYTES)
    try:
        with trio.move_on_after(conn.server.handshake_timeout):
            return await messages.receive()
        log.info(
            "connection %s: no Hello within %.0fs; closing",
            conn.peer,
            conn.server.handshake_timeout,
        )
        return None
    finally:
        messages.max_message_bytes = limit


def answer_hello(conn: Peer, rid: int, hello: wire.Hello) -> Item:
    """Check the version and the token; the answer greets ``conn`` or closes it."""
    if hello.protocol_version != PROTOCOL_VERSION:
        return error_item(
            rid,
            Unsupported(
                f"protocol version {hello.protocol_version}; this server speaks {PROTOCOL_VERSION}"
            ),
            close=True,
        )
    config = conn.server.config
    token = config.token
    if token and not token_matches(hello.token, token):
        # Never the token itself, nor what was sent instead (it may be a
        # near miss of the real one).
        log.warning("connection %s: bad or missing token; closing", conn.peer)
        return error_item(rid, Unauthorized("bad or missing token"), close=True)
    conn.greeted = True
    conn.client_name = hello.client
    response = wire.Response(
        request_id=rid,
        hello=wire.HelloResponse(
            protocol_version=PROTOCOL_VERSION,
            server=f"segment-gateway {__version__}",
            max_message_bytes=config.max_message_bytes,
            max_append_bytes=conn.server.container_config_max_append,
            features=FEATURES,
        ),
    )
    return Item(rid, 0, ready(response))
