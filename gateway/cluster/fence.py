"""Epoch fencing of a node id across hosts (Pravega's epoch fencing, in Tier 2).

Every start of a node registers its journal epoch as the object
``_cluster/fence/<node id>/<epoch, 20 digits>``, created only if absent
(``If-None-Match: *``); its body says who registered it (`EpochClaim`:
host, boot id, process, journal directory, a nonce). The node id's
*current* epoch is the highest one registered. A process whose epoch is
below it is *fenced*:

- it refuses to start (`NodeFenced`);
- a process of it still running (a zombie: cut off, not dead) stops
  acknowledging within its lease (`gateway.cluster.lease`), because it can
  no longer confirm that its epoch is current, and once it sees the higher
  epoch it refuses every change and uploads nothing;
- what it uploads after the fence is never trusted: an object of an epoch
  is believed only if Tier 2 stored it before the next epoch's fence key
  (`FenceTimes`), and a recovery or a follower uses the newest epoch's
  snapshots first.

Registration checks the result of its conditional write: an epoch this
process did not register itself (a copied data directory started beside
the original, or the same node started twice) refuses the start
(`EpochTaken`), as does a previous epoch that is still heartbeating
(`NodeRunsElsewhere`, `gateway.cluster.lease.claim_epoch`).

Keys are only ever added, so the current epoch only rises, whatever a
zombie writes.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

from gateway.config import CLUSTER_PREFIX
from gateway.errors import ChunkNotFound, GatewayError
from gateway.storage.layer import ChunkLayer
from gateway.tier2.untrusted import BadRecord, Rejections, decimal, want_int, want_str

#: Format of an epoch claim's body.
CLAIM_FORMAT = 1
#: An epoch claim is a few hundred bytes.
MAX_CLAIM_BYTES = 16 * 1024


class NodeFenced(GatewayError):
    """node {} (epoch {}) has been taken over by epoch {}: this node's journal is \
stale. Do not run it again under this id; its data lives on with the new epoch"""

    exit_code = 31
    wire_code = "UNAVAILABLE"


class EpochTaken(GatewayError):
    """epoch {1} of node {0} was registered by another process ({2}): this data \
directory is a copy of that node's (a restored backup, a cloned machine), or \
the node was started twice. Refusing to start. Run only one of them; a copy \
must get a node.id of its own and an empty data directory"""

    exit_code = 44
    wire_code = "UNAVAILABLE"


class NodeRunsElsewhere(GatewayError):
    """node {} is running elsewhere ({}): its heartbeat in Tier 2 is still \
changing. Refusing to start a second process with the same node.id (a copied \
data directory?). Stop the other one first; to take over a node whose host is \
cut off, use --recover-from-tier2"""

    exit_code = 44
    wire_code = "UNAVAILABLE"


def fence_prefix(node: str) -> str:
    """Where a node id's registered epochs are."""
    return f"{CLUSTER_PREFIX}/fence/{node}/"


def fence_key(node: str, epoch: int) -> str:
    """The key registering ``epoch`` of ``node``."""
    return f"{fence_prefix(node)}{epoch:020d}"


def boot_id() -> str:
    """This machine's boot (Linux): two processes with one boot id ran on one kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class EpochClaim:
    """Who registered an epoch (the body of its fence key)."""

    node: str
    epoch: int
    host: str
    pid: int
    #: The kernel boot the process ran on ("" if unknown).
    boot_id: str
    #: The journal directory (absolute): with the boot id, whether this
    #: process's directory lock proves the registering process gone.
    journal_dir: str
    #: Random per registration: tells a retried write of our own from another's.
    nonce: str
    at_ms: int
    #: The registering process's lease (ms; 0 = none): how long after its
    #: last confirmation it may still acknowledge.
    lease_ms: int = 0
    #: Registered by a takeover (``--recover-from-tier2``), not a start.
    takeover: bool = False

    @classmethod
    def mine(
        cls, node: str, epoch: int, journal_dir: str, lease: float, takeover: bool = False
    ) -> EpochClaim:
        """A claim for this process."""
        return cls(
            node=node,
            epoch=epoch,
            host=socket.gethostname(),
            pid=os.getpid(),
            boot_id=boot_id(),
            journal_dir=os.path.realpath(journal_dir),
            nonce=uuid.uuid4().hex,
            at_ms=int(time.time() * 1000),
            lease_ms=int(lease * 1000),
            takeover=takeover,
        )

    def encode(self) -> bytes:
        """The stored JSON body."""
        return json.dumps({"format": CLAIM_FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> EpochClaim:
        """Parse a stored claim; `BadRecord` saying why if unusable."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise BadRecord(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRecord("not a JSON object")
        if doc.get("format", CLAIM_FORMAT) != CLAIM_FORMAT:
            raise BadRecord(f"claim format {doc.get('format')!r} is unknown")
        takeover = doc.get("takeover", False)
        if not isinstance(takeover, bool):
            raise BadRecord("field 'takeover' is not true or false")
        return cls(
            node=want_str(doc, "node", max_len=255),
            epoch=want_int(doc, "epoch"),
            host=want_str(doc, "host", default="", max_len=1024),
            pid=want_int(doc, "pid", high=1 << 32) if "pid" in doc else 0,
            boot_id=want_str(doc, "boot_id", default="", max_len=64),
            journal_dir=want_str(doc, "journal_dir", default="", max_len=4096),
            nonce=want_str(doc, "nonce", default="", max_len=64),
            at_ms=want_int(doc, "at_ms") if "at_ms" in doc else 0,
            lease_ms=want_int(doc, "lease_ms") if "lease_ms" in doc else 0,
            takeover=takeover,
        )

    def describe(self) -> str:
        """Who, for messages."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at_ms / 1000))
        return (
            f"host {self.host or '?'}, pid {self.pid}, journal {self.journal_dir or '?'}, "
            f"{when} UTC"
        )

    def gone_if_locked_by(self, me: EpochClaim) -> bool:
        """Whether ``me`` holding the journal directory lock proves this process gone.

        True when it ran on this very boot with this very journal directory:
        its directory lock would have kept ``me`` from starting.
        """
        return (
            bool(self.boot_id)
            and self.boot_id == me.boot_id
            and (self.journal_dir == me.journal_dir)
        )


async def fence_epochs(
    layer: ChunkLayer,
    node: str,
    deadline: float | None = None,
    rejections: Rejections | None = None,
) -> dict[int, float]:
    """Every registered epoch of ``node`` -> when Tier 2 stored its key (Unix s)."""
    out: dict[int, float] = {}
    prefix = fence_prefix(node)
    for obj in await layer.list(prefix, deadline=deadline):
        name = obj.key[len(prefix) :]
        try:
            epoch = decimal(name, "epoch key")
        except BadRecord as e:
            if rejections is not None:
                rejections.reject("epoch fence", obj.key, str(e), obj.key)
            continue
        out[epoch] = obj.mtime
    return out


async def current_epoch(layer: ChunkLayer, node: str, deadline: float | None = None) -> int:
    """The highest epoch registered for ``node`` (0: none)."""
    return max(await fence_epochs(layer, node, deadline), default=0)


async def read_claim(
    layer: ChunkLayer, node: str, epoch: int, deadline: float | None = None
) -> EpochClaim | None:
    """Who registered ``epoch`` of ``node``; None if unknown (absent or unreadable)."""
    key = fence_key(node, epoch)
    try:
        data = await layer.read(key, 0, MAX_CLAIM_BYTES, deadline=deadline)
    except ChunkNotFound:
        return None
    try:
        claim = EpochClaim.decode(data)
    except BadRecord:
        return None  # an older version's body, or damaged: nothing is proven by it
    return claim if claim.node == node and claim.epoch == epoch else None


async def register_epoch(
    layer: ChunkLayer, node: str, epoch: int, me: EpochClaim | None = None
) -> None:
    """Claim ``epoch`` for ``node``: `NodeFenced` if a higher one exists, `EpochTaken`
    if another process registered this one."""
    me = me or EpochClaim.mine(node, epoch, "", 0.0)
    current = await current_epoch(layer, node)
    if current > epoch:
        raise NodeFenced(node, epoch, current)
    created = await layer.write_if_absent(fence_key(node, epoch), me.encode(), {"node": node})
    if not created:
        # Ours only if our own earlier try wrote it (its answer lost).
        theirs = await read_claim(layer, node, epoch)
        if theirs is None or theirs.nonce != me.nonce:
            who = theirs.describe() if theirs is not None else "an unreadable registration"
            raise EpochTaken(node, epoch, who)
    # A takeover racing with this start: whoever registered higher wins.
    current = await current_epoch(layer, node)
    if current > epoch:
        raise NodeFenced(node, epoch, current)


class FenceTimes:
    """When each epoch of a node was fenced, as Tier 2's own clock says.

    An object written by epoch E of a node is trusted only if Tier 2 stored
    it no later than the first higher epoch's fence key: once a takeover
    has registered, whatever the old process still manages to upload (a
    zombie's chunk or snapshot) is not believed by a recovery, a follower or
    fsck. Both times are object modification times of the one Tier 2, so
    the nodes' clocks do not matter (only Tier 2's timestamp resolution:
    an upload in the same second as the fence is still believed).
    """

    def __init__(self, registered: dict[int, float]) -> None:
        #: epoch -> when its fence key was stored.
        self.registered = dict(registered)
        self.current = max(registered, default=0)

    @classmethod
    async def read(
        cls,
        layer: ChunkLayer,
        node: str,
        deadline: float | None = None,
        rejections: Rejections | None = None,
    ) -> FenceTimes:
        """The fences of ``node`` as Tier 2 holds them now."""
        return cls(await fence_epochs(layer, node, deadline, rejections))

    def fenced_at(self, epoch: int) -> float:
        """When the first epoch above ``epoch`` was registered (inf: not fenced)."""
        return min((t for e, t in self.registered.items() if e > epoch), default=float("inf"))

    def trusted(self, epoch: int, mtime: float) -> bool:
        """Whether an object of ``epoch`` stored at ``mtime`` was written before its fence."""
        return mtime <= self.fenced_at(epoch)


async def all_current_epochs(
    layer: ChunkLayer, deadline: float | None = None, rejections: Rejections | None = None
) -> dict[str, int]:
    """Every node id's current (highest registered) epoch, from one listing."""
    prefix = f"{CLUSTER_PREFIX}/fence/"
    out: dict[str, int] = {}
    for obj in await layer.list(prefix, deadline=deadline):
        node, _, name = obj.key[len(prefix) :].partition("/")
        try:
            if not node or "/" in name:
                raise BadRecord("not an epoch fence key")
            epoch = decimal(name, "epoch key")
        except BadRecord as e:
            if rejections is not None:
                rejections.reject("epoch fence", obj.key, str(e), obj.key)
            continue
        out[node] = max(out.get(node, 0), epoch)
    return out
