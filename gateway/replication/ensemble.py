"""The ensemble record: which peers hold a node's journal, where recovery finds it.

One small JSON object per source node and epoch in the shared bucket,
``<cluster prefix>/replication/<node>/<epoch, 20 digits>``, rewritten by the
source at every ensemble change (BookKeeper keeps its ensembles in the
ledger metadata). Recovery reads the newest epoch's record, fences its
members, and needs answers from enough of them that every acknowledged
write group is among the answers: a group acknowledged with ``ack_quorum``
copies (the source's own included) is on at least ``ack_quorum - 1``
members, so at most ``len(members) - (ack_quorum - 1)`` members can lack
it (`needed_answers`).

Like everything read from the bucket, a record is checked field by field
(`gateway.tier2.untrusted`); an unusable one is skipped and said once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from gateway.config import CLUSTER_PREFIX
from gateway.errors import ChunkNotFound
from gateway.storage.layer import ChunkLayer
from gateway.tier2.untrusted import BadRecord, Rejections, decimal, want_int, want_str

ENSEMBLE_FORMAT = 1
MAX_RECORD_BYTES = 64 * 1024


def ensemble_prefix(node: str) -> str:
    """Where ``node``'s ensemble records are."""
    return f"{CLUSTER_PREFIX}/replication/{node}/"


def ensemble_key(node: str, epoch: int) -> str:
    """The record of ``node``'s ensemble in ``epoch``."""
    return f"{ensemble_prefix(node)}{epoch:020d}"


@dataclass(frozen=True)
class Ensemble:
    """The peers holding one epoch of a node's journal."""

    node: str
    epoch: int
    #: Peer node ids whose logs count for acknowledgements (caught up when added).
    members: tuple[str, ...]
    write_quorum: int
    ack_quorum: int
    changed_at_ms: int = 0

    def encode(self) -> bytes:
        """The JSON object stored in Tier 2."""
        return json.dumps(
            {
                "format": ENSEMBLE_FORMAT,
                "node": self.node,
                "epoch": self.epoch,
                "members": list(self.members),
                "write_quorum": self.write_quorum,
                "ack_quorum": self.ack_quorum,
                "changed_at_ms": self.changed_at_ms or int(time.time() * 1000),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes, node: str, epoch: int) -> Ensemble:
        """Parse a stored record; `BadRecord` saying why if unusable."""
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise BadRecord(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRecord("not a JSON object")
        if want_int(doc, "format") != ENSEMBLE_FORMAT:
            raise BadRecord(f"format {doc['format']} is not {ENSEMBLE_FORMAT}")
        if want_str(doc, "node", max_len=128) != node:
            raise BadRecord(f"names node {doc['node']!r}, its key {node!r}")
        if want_int(doc, "epoch", low=1) != epoch:
            raise BadRecord(f"names epoch {doc['epoch']}, its key {epoch}")
        members = doc.get("members")
        if not isinstance(members, list) or len(members) > 64:
            raise BadRecord("field 'members' is not a list of at most 64 node ids")
        for m in members:
            if not isinstance(m, str) or not 0 < len(m) <= 128 or m == node:
                raise BadRecord(f"member {m!r} is not another node's id")
        if len(set(members)) != len(members):
            raise BadRecord("field 'members' names a node twice")
        write_quorum = want_int(doc, "write_quorum", low=1, high=64)
        ack_quorum = want_int(doc, "ack_quorum", low=1, high=write_quorum)
        return cls(node, epoch, tuple(members), write_quorum, ack_quorum,
                   want_int(doc, "changed_at_ms"))  # fmt: skip

    def needed_answers(self) -> int:
        """Members that must answer a recovery so that no acknowledged group is missed."""
        # ack_quorum 1 (asynchronous replicas): every member, the best there is.
        return max(1, min(len(self.members), len(self.members) - (self.ack_quorum - 1) + 1))


async def write_ensemble(layer: ChunkLayer, ensemble: Ensemble, deadline: float) -> None:
    """Record (replace) ``ensemble`` in Tier 2."""
    await layer.write(
        ensemble_key(ensemble.node, ensemble.epoch),
        ensemble.encode(),
        {"node": ensemble.node},
        deadline=deadline,
    )


async def read_ensembles(
    layer: ChunkLayer,
    node: str,
    rejections: Rejections | None = None,
    deadline: float | None = None,
) -> list[Ensemble]:
    """Every usable ensemble record of ``node``, newest epoch first."""
    prefix = ensemble_prefix(node)
    out = []
    for obj in await layer.list(prefix, deadline=deadline):
        try:
            epoch = decimal(obj.key[len(prefix) :], "ensemble epoch", low=1)
            data = await layer.read(obj.key, 0, MAX_RECORD_BYTES, deadline=deadline)
            out.append(Ensemble.decode(data, node, epoch))
        except ChunkNotFound:
            continue
        except BadRecord as e:
            if rejections is not None:
                rejections.reject("ensemble", obj.key, str(e), obj.key)
    return sorted(out, key=lambda e: -e.epoch)


async def delete_ensembles_before(layer: ChunkLayer, node: str, epoch: int) -> None:
    """Drop the records of ``node``'s epochs below ``epoch`` (their logs are gone)."""
    prefix = ensemble_prefix(node)
    for obj in await layer.list(prefix):
        try:
            older = decimal(obj.key[len(prefix) :], "ensemble epoch") < epoch
        except BadRecord:
            continue
        if older:
            await layer.delete(obj.key)
