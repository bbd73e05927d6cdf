"""Hostile peers for tests: raw protocol frames, resident memory, and a mixed attack load.

`hostile_load` is what the torture test runs next to its writers: in turn,
pipelined reads whose answers are never read, pipelined lists, connections
stalled one byte short of a large message, idle connections that never say
Hello, and malformed requests (garbage, an append whose data has the wrong
wire type). Each attack holds its connections a moment, then drops them.
"""

from __future__ import annotations

import pathlib
import random
import struct

import trio

from gateway.protocol import wire_pb2 as wire


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def frame(req: wire.Request) -> bytes:
    """One request as it goes on the wire: a 4-byte big-endian length, then the message."""
    data = req.SerializeToString()
    return struct.pack(">I", len(data)) + data


HELLO = frame(wire.Request(request_id=1, hello=wire.Hello(protocol_version=1)))


def _wrong_wire_type() -> bytes:
    """A framed AppendRequest (Request field 4) whose data (field 15) is a varint."""
    append = b"\x0a\x03a/b" + bytes([(15 << 3) | 0, 5])  # segment "a/b"; data as varint 5
    request = b"\x08\x07" + bytes([(4 << 3) | 2, len(append)]) + append  # request_id 7
    return struct.pack(">I", len(request)) + request


WRONG_WIRE_TYPE = _wrong_wire_type()


class HostileLoad:
    """Counters of what `hostile_load` did (for the torture summary)."""

    def __init__(self) -> None:
        self.attacks: dict[str, int] = {}
        self.connections = 0


async def _connect(address: str, load: HostileLoad) -> trio.SocketStream | None:
    host, port = address.rsplit(":", 1)
    try:
        stream = await trio.open_tcp_stream(host, int(port))
    except OSError:
        return None  # the daemon is down or refusing: come back later
    load.connections += 1
    return stream


async def _send_all(stream: trio.SocketStream, data: bytes, seconds: float) -> None:
    """Send what the peer takes within ``seconds`` (a peer that never reads stalls us)."""
    with trio.move_on_after(seconds):
        await stream.send_all(data)


async def _attack(
    kind: str, address: str, segment: str, max_message: int, load: HostileLoad, hold: float
) -> None:
    streams: list[trio.SocketStream] = []
    try:
        if kind == "unread_reads":
            read = wire.Request(
                request_id=2, read=wire.ReadRequest(segment=segment, offset=0, max_length=1 << 20)
            )
            for _ in range(3):
                s = await _connect(address, load)
                if s is not None:
                    streams.append(s)
                    await _send_all(s, HELLO + frame(read) * 2000, hold)
        elif kind == "list_flood":
            s = await _connect(address, load)
            if s is not None:
                streams.append(s)
                listing = wire.Request(request_id=3, list=wire.ListSegmentsRequest(prefix=""))
                await _send_all(s, HELLO + frame(listing) * 500, hold)
        elif kind == "stalled_message":
            for _ in range(8):
                s = await _connect(address, load)
                if s is not None:
                    streams.append(s)
                    # Everything but the last byte of the largest message allowed.
                    head = struct.pack(">I", max_message)
                    await _send_all(s, HELLO + head + bytes(max_message - 1), hold)
        elif kind == "idle_no_hello":
            for _ in range(50):
                s = await _connect(address, load)
                if s is not None:
                    streams.append(s)
        elif kind == "malformed":
            for junk in (WRONG_WIRE_TYPE, b"\xff" * 64, struct.pack(">I", 5) + b"\x08\x80\x80"):
                s = await _connect(address, load)
                if s is not None:
                    streams.append(s)
                    await _send_all(s, HELLO + junk, hold)
        await trio.sleep(hold)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the daemon closed us: what it should do to a hostile peer
    finally:
        for s in streams:
            s.socket.close()
    load.attacks[kind] = load.attacks.get(kind, 0) + 1


ATTACKS = ("unread_reads", "list_flood", "stalled_message", "idle_no_hello", "malformed")


async def hostile_load(
    address: str,
    segment: str,
    max_message: int,
    stop: trio.Event,
    rng: random.Random,
    load: HostileLoad,
) -> None:
    """Run the attacks in turn, at random, until ``stop`` is set."""
    while not stop.is_set():
        kind = rng.choice(ATTACKS)
        with trio.move_on_after(30):
            await _attack(kind, address, segment, max_message, load, rng.uniform(0.5, 2.0))
        await trio.sleep(rng.uniform(0.1, 0.5))
