"""The one table of request kinds: what the server does with each.

Each handler module declares its kinds where it defines them::

    @handles("truncate", changes=True, frees=True)
    def truncate(conn: Peer, req: wire.Request) -> Producer: ...

    @streams("read", answer_bytes=read_answer_bytes)
    def read(conn: Peer, req: wire.Request) -> Item: ...

and the connection looks every request up in `HANDLERS` by its name in
wire.proto's ``Request.kind`` (tests/test_protocol.py checks that each
kind but Hello is here). A new kind therefore touches wire.proto, one
module in `gateway/server/handlers/`, and the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gateway.protocol import wire_pb2 as wire

from .answers import Item, Producer

if TYPE_CHECKING:
    from .context import Peer

#: Whether a request (of a kind that may) does something: frees journal
#: space, changes nothing after all, or creates a name (returning it).
Predicate = Callable[[wire.Request], bool]
#: Bytes a request's answer will hold, charged before it is prepared.
AnswerBytes = Callable[["Peer", wire.Request], int]
Prepare = Callable[["Peer", wire.Request], Producer]
Stream = Callable[["Peer", wire.Request], Item]


@dataclass(frozen=True)
class Handler:
    """How the server takes one kind of request."""

    kind: str
    #: Prepares it now (in arrival order) and returns how to answer later
    #: (None for a streamed kind).
    prepare: Prepare | None = None
    #: For kinds answered as a stream of responses, produced as they go:
    #: the item that sends them (never waits for the journal).
    stream: Stream | None = None
    #: Changes something: waits for room in the journal and the cache first.
    changes: bool = False
    #: Frees journal space (a deletion or truncation, or -- a predicate --
    #: only some requests of the kind): admitted while the journal's disk
    #: is full.
    frees: bool | Predicate = False
    #: A request of a changing kind that changes nothing (a stream's get or
    #: list): answered without waiting for room in the journal, like any read.
    reads_only: Predicate | None = None
    #: A bound (or, for answers of many segments, an estimate) of the
    #: answer's memory; None: nothing beyond the request itself.
    answer_bytes: AnswerBytes | None = None
    #: The name a request creates, which a cluster claims first (None if it
    #: creates none).
    claims_name: Callable[[wire.Request], str | None] | None = None

    def mutating(self, req: wire.Request) -> bool:
        """Whether ``req`` waits for room in the journal before it is prepared."""
        return self.changes and not (self.reads_only is not None and self.reads_only(req))

    def freeing(self, req: wire.Request) -> bool:
        """Whether ``req`` may go ahead while the journal's disk is full."""
        return self.frees if isinstance(self.frees, bool) else self.frees(req)

    def claimed_name(self, req: wire.Request) -> str | None:
        """The name ``req`` creates, claimed cluster-wide first; None if none."""
        return self.claims_name(req) if self.claims_name is not None else None


#: Every request kind after Hello, by its name in wire.proto's Request.kind.
HANDLERS: dict[str, Handler] = {}

P = TypeVar("P", bound=Prepare)
S = TypeVar("S", bound=Stream)


def _register(handler: Handler) -> None:
    if handler.kind in HANDLERS:
        raise ValueError(f"request kind {handler.kind!r} is registered twice")
    if handler.kind not in wire.Request.DESCRIPTOR.fields_by_name:
        raise ValueError(f"request kind {handler.kind!r} is not in wire.proto")
    HANDLERS[handler.kind] = handler


def handles(
    kind: str,
    *,
    changes: bool = False,
    frees: bool | Predicate = False,
    reads_only: Predicate | None = None,
    answer_bytes: AnswerBytes | None = None,
    claims_name: Callable[[wire.Request], str | None] | None = None,
) -> Callable[[P], P]:
    """Register the decorated function as how ``kind`` is prepared (see `Handler`)."""

    def register(prepare: P) -> P:
        _register(
            Handler(
                kind,
                prepare=prepare,
                changes=changes,
                frees=frees,
                reads_only=reads_only,
                answer_bytes=answer_bytes,
                claims_name=claims_name,
            )
        )
        return prepare

    return register


def streams(kind: str, *, answer_bytes: AnswerBytes | None = None) -> Callable[[S], S]:
    """Register the decorated function as how ``kind`` is answered as a stream."""

    def register(stream: S) -> S:
        _register(Handler(kind, stream=stream, answer_bytes=answer_bytes))
        return stream

    return register
