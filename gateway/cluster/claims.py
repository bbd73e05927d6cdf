"""Segment names, unique across the cluster, claimed in Tier 2 with conditional writes.

Before a node creates a segment it creates ``_cluster/names/<sha256 of the
name>`` with ``If-None-Match: *`` (`ChunkLayer.write_if_absent`): of nodes
racing for one name exactly one succeeds, and Tier 2 itself is the arbiter,
with no other service. The claim names its node; the loser's create fails
with `SegmentExistsElsewhere` naming the owner. Deleting a segment releases
its claim, so the name is free again.

The key is a hash so that any segment name (up to 1024 bytes, with ``/``)
makes one flat, fixed-length key on every binding; the name itself is in the
claim's body (docs/FORMATS.md, "Cluster records in Tier 2").

A node that dies between a deletion and its release, or between claiming a
name and creating the segment, leaves a claim without a segment: fsck's
``name-claims`` check finds those (`read_claim`) and releases them
(`release_orphan`), never while a create of the name may be in flight.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import trio

from gateway.config import CLUSTER_PREFIX
from gateway.errors import ChunkNotFound, GatewayError, SegmentExistsElsewhere, Tier2Error
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

NAMES_PREFIX = f"{CLUSTER_PREFIX}/names/"
CLAIM_FORMAT = 1


def claim_key(name: str) -> str:
    """Tier-2 key of the claim on segment ``name``."""
    return NAMES_PREFIX + hashlib.sha256(name.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """One claim object as read from Tier 2."""

    key: str
    #: The segment (or stream) name it holds.
    name: str
    #: The node holding it.
    node: str
    #: Its object's last modification (Unix seconds): when it was claimed.
    mtime: float
    #: Its bytes as read: a release deletes it only if they are still these.
    body: bytes


def parse_claim(key: str, data: bytes, mtime: float) -> Claim:
    """The claim in ``data`` (the object ``key``); ValueError if it is not one."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    fmt = doc.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise ValueError(f"its 'format' is {fmt!r}, not a claim format")
    if fmt > CLAIM_FORMAT:
        # A newer version's claim: what its fields mean is that version's to say.
        raise ValueError(f"format {fmt}, newer than this version's {CLAIM_FORMAT}")
    name, node = doc.get("name"), doc.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError(f"its 'node' is {node!r}, not a node id")
    if not isinstance(name, str) or claim_key(name) != key:
        raise ValueError(f"its 'name' {name!r} is not the name its key is the hash of")
    return Claim(key, name, node, mtime, bytes(data))


async def read_claim(layer: ChunkLayer, key: str, mtime: float, deadline: float) -> Claim | None:
    """The claim object ``key`` (None if it is gone); ValueError if unreadable."""
    try:
        data = await layer.read(key, 0, 1 << 16, deadline=deadline)
    except ChunkNotFound:
        return None
    return parse_claim(key, data, mtime)


async def release_orphan(
    layer: ChunkLayer,
    claim: Claim,
    alive: Callable[[str], bool],
    guard: NameClaims | None = None,
    deadline: float = 10.0,
) -> str:
    """Delete ``claim``, which names no segment; "" if done, else why it was kept.

    Kept if a create of its name is in flight in this process (``guard``,
    the daemon's `NameClaims`), if its name is ``alive`` now, or if the
    object changed since it was read (read again just before the delete).
    While the delete runs, the guard holds back this process's claims of the
    name. S3's DeleteObject is not made conditional here (the bindings have
    no If-Match delete): a window remains between the second read and the
    delete, in which only a process of the same node id could reuse the
    claim (not another node: the object exists until the delete) -- a
    container this node's id hosted elsewhere while fsck runs offline.
    """
    name = claim.name
    async with contextlib.AsyncExitStack() as stack:
        if guard is not None:
            await stack.enter_async_context(guard.releasing_name(name))
            if guard.in_flight(name):
                return "a create of the name is in flight"
        try:
            now = await read_claim(layer, claim.key, claim.mtime, deadline)
        except ValueError:
            return "it changed since it was read"
        if now is None:
            return ""  # released meanwhile
        if now.body != claim.body:
            return "it changed since it was read"
        if alive(name):
            return "the name is a segment or stream now"
        await layer.delete(claim.key, deadline=deadline)
        if guard is not None:
            guard.unreleased.discard(name)
    return ""


class NameClaims:
    """Claims and releases segment names for one node."""

    def __init__(
        self,
        layer: ChunkLayer,
        node_id: str,
        epoch: int,
        address_of: Callable[[str], str] = lambda node: "",
        deadline: float = 10.0,
    ) -> None:
        self.layer = layer
        self.node_id = node_id
        self.epoch = epoch
        #: Where a node listens (from the registry), for the loser's error.
        self.address_of = address_of
        self.deadline = deadline
        #: Names whose release failed (Tier 2 down): tried again by `retry_releases`.
        self.unreleased: set[str] = set()
        self.claimed = 0
        self.refused = 0
        #: Names claimed whose create is not settled yet (`settle`), with how
        #: many creates of each: fsck releases none of these.
        self._in_flight: collections.Counter[str] = collections.Counter()
        #: Names whose orphan claim `release_orphan` is deleting: a claim of
        #: one waits until it is gone, then claims anew.
        self.releasing: dict[str, trio.Event] = {}

    def in_flight(self, name: str) -> bool:
        """Whether a create of ``name`` claimed it and has not settled."""
        return name in self._in_flight

    def settle(self, name: str) -> None:
        """A create that `claim` returned for is done (created, or failed)."""
        self._in_flight[name] -= 1
        if self._in_flight[name] <= 0:
            del self._in_flight[name]

    def _body(self, name: str) -> bytes:
        doc = {"format": CLAIM_FORMAT, "name": name, "node": self.node_id, "epoch": self.epoch}
        return json.dumps(doc, sort_keys=True).encode()

    async def owner(self, name: str) -> str | None:
        """The node holding the claim on ``name``, or None."""
        try:
            data = await self.layer.read(claim_key(name), 0, 1 << 16, deadline=self.deadline)
        except ChunkNotFound:
            return None
        try:
            doc = json.loads(data)
            holder = doc["node"] if isinstance(doc, dict) else None
            if not isinstance(holder, str) or not holder:
                raise ValueError(f"its 'node' is {holder!r}, not a node id")
            return holder
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            # Not guessed either way: the name stays unusable until someone
            # looks (the message says which object).
            raise Tier2Error(
                f"segment {name!r}: its name claim {claim_key(name)} in Tier 2 is unreadable "
                f"({e}); if no node has this segment, delete that object"
            ) from None

    async def claim(self, name: str, *, hold: bool = False) -> None:
        """Hold ``name`` for this node; `SegmentExistsElsewhere` if another node does.

        A claim this node already holds (a retried create, or one left by a
        crash before the create was durable) is this node's to use.
        ``hold``: for a create, whose name is then in flight until `settle`
        is called (not if this raises): a release of it waits for
        `retry_releases`, and fsck keeps it.
        """
        while (releasing := self.releasing.get(name)) is not None:
            await releasing.wait()
        if not hold:
            await self._claim(name)
            return
        self._in_flight[name] += 1
        try:
            await self._claim(name)
        except BaseException:
            self.settle(name)
            raise

    async def _claim(self, name: str) -> None:
        self.unreleased.discard(name)
        for _ in range(3):  # the holder may release it between our two calls
            created = await self.layer.write_if_absent(
                claim_key(name), self._body(name), {"node": self.node_id}, deadline=self.deadline
            )
            if created:
                self.claimed += 1
                return
            owner = await self.owner(name)
            if owner == self.node_id:
                return
            if owner is not None:
                self.refused += 1
                raise SegmentExistsElsewhere(name, owner, self.address_of(owner))
        raise GatewayError(f"segment {name!r}: its name claim keeps changing; try again")

    @contextlib.asynccontextmanager
    async def releasing_name(self, name: str) -> AsyncIterator[None]:
        """Hold back this node's claims of ``name`` (and other releases) meanwhile."""
        while (other := self.releasing.get(name)) is not None:
            await other.wait()
        done = self.releasing[name] = trio.Event()
        try:
            yield
        finally:
            del self.releasing[name]
            done.set()

    async def release(self, name: str) -> None:
        """Free ``name`` (after its deletion is durable); a failure is retried later.

        Not while a create of the name holds the claim (pipelined after the
        deletion): `retry_releases` releases it later unless that created
        the segment.
        """
        async with self.releasing_name(name):
            if self.in_flight(name):
                self.unreleased.add(name)
                return
            try:
                if await self.owner(name) == self.node_id:
                    await self.layer.delete(claim_key(name), deadline=self.deadline)
                self.unreleased.discard(name)
            except GatewayError as e:
                log.warning("cluster: name %r not released yet (tried again later): %s", name, e)
                self.unreleased.add(name)

    async def retry_releases(self, exists: Callable[[str], bool]) -> None:
        """Release again the names whose release failed (unless created anew since)."""
        for name in list(self.unreleased):
            if exists(name):
                self.unreleased.discard(name)
            else:
                await self.release(name)

    async def claim_existing(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """Claim segments made before names were claimed (once per node: the caller
        remembers it did); names this node holds already are fine.

        Returns (name, other node) for every segment whose name another node
        holds: a conflict from before names were unique, for an operator.
        """
        conflicts: list[tuple[str, str]] = []
        failures: list[GatewayError] = []
        limiter = trio.CapacityLimiter(8)

        async def one(name: str) -> None:
            async with limiter:
                try:
                    await self.claim(name)
                except SegmentExistsElsewhere as e:
                    conflicts.append((name, e.owner))
                except GatewayError as e:
                    failures.append(e)  # raised below as itself, not in a group

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)
        if failures:
            raise failures[0]
        return sorted(conflicts)
