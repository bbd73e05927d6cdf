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
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable

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

    async def claim(self, name: str) -> None:
        """Hold ``name`` for this node; `SegmentExistsElsewhere` if another node does.

        A claim this node already holds (a retried create, or one left by a
        crash before the create was durable) is this node's to use.
        """
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

    async def release(self, name: str) -> None:
        """Free ``name`` (after its deletion is durable); a failure is retried later."""
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
