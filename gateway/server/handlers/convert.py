"""Request fields as the container's values, checked (BadRequest if unknown)."""

from __future__ import annotations

from gateway.container import AttributeUpdate, Verb
from gateway.errors import BadRequest
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.codec import Codec


def codec(number: int) -> Codec:
    """The event codec a request names."""
    found = Codec.from_number(number)
    if found.number != number:
        raise BadRequest(f"unknown event codec {number}")
    return found


def updates(updates: list[wire.AttributeUpdate]) -> list[AttributeUpdate]:
    """A request's attribute updates."""
    out = []
    for u in updates:
        try:
            verb = Verb(u.verb)
        except ValueError:
            raise BadRequest(f"unknown attribute verb {u.verb}") from None
        out.append(AttributeUpdate(u.id, verb, u.value, u.compare_value, u.expect_absent))
    return out
