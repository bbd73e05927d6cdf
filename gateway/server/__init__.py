"""The protocol server: TCP connections in, container operations out.

One room per job:

- `listener` -- `Server`: accepting, the connection bound from the file
  descriptor limit, TLS handshakes, stalled peers, the ordered stop;
- `connection` -- one connection: the read loop, admission (memory,
  journal room, attribute prefetch), answers strictly in request order;
- `hello` -- the first request: protocol version and token;
- `budget` -- `MemoryBudget`, the bytes held by requests in flight;
- `routing` -- a cluster's part: NOT_OWNER answers, name claims for
  creates, other nodes' segments;
- `registry` -- `HANDLERS`, the one table of request kinds, filled by
- `handlers/` -- the handlers, one module per area (segments, attributes,
  streams, transactions, admin), each declaring its kinds with
  ``@handles(kind, ...)`` or ``@streams(kind)``;
- `answers` -- what a prepared request becomes (`Item`, `Producer`).

A new request kind touches wire.proto, one module in `handlers/` and the
client (docs/ARCHITECTURE.md, "The server package").
"""

from . import handlers
from .answers import error_response
from .budget import MemoryBudget
from .connection import Connection
from .listener import Server, fd_connection_limit
from .registry import HANDLERS, Handler, handles, streams

__all__ = [
    "HANDLERS",
    "Connection",
    "Handler",
    "MemoryBudget",
    "Server",
    "error_response",
    "fd_connection_limit",
    "handlers",
    "handles",
    "streams",
]
