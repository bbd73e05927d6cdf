"""The node registry: one small record per node in Tier 2, refreshed as a heartbeat.

Nodes that share a Tier-2 bucket and prefix find each other here, with no
other service: each node writes ``_cluster/nodes/<node id>.json`` when it
starts and again every ``cluster.heartbeat_interval``, and marks it
``stopped`` when it stops cleanly. A node whose last heartbeat is older than
``cluster.down_after`` is *down* (crashed, cut off, or its host gone).

Heartbeat ages compare the writer's clock (in the record) with the reader's:
the nodes' clocks must agree to well within ``down_after`` (NTP does).
The record format is in docs/FORMATS.md ("Node registry").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from gateway.config import CLUSTER_PREFIX
from gateway.errors import ChunkNotFound, GatewayError
from gateway.tier2.layer import ChunkLayer

log = logging.getLogger(__name__)

#: Version of the registry record; a reader skips records of a newer major version.
RECORD_FORMAT = 1
NODES_PREFIX = f"{CLUSTER_PREFIX}/nodes/"

#: States a node is listed in.
UP, DOWN, STOPPED = "up", "down", "stopped"


def record_key(node_id: str) -> str:
    """Tier-2 key of a node's registry record."""
    return f"{NODES_PREFIX}{node_id}.json"


@dataclass(frozen=True)
class NodeRecord:
    """What a node says of itself in the registry."""

    id: str
    #: HOST:PORT other nodes and clients connect to.
    advertise: str
    #: The node's journal epoch (raised at every start and by a takeover).
    epoch: int
    #: Software version.
    version: str
    started_at_ms: int
    heartbeat_at_ms: int
    #: "up" while it runs, "stopped" after a clean stop.
    state: str
    segments: int = 0
    #: Committed bytes not yet in Tier 2.
    unflushed_bytes: int = 0
    host: str = ""
    pid: int = 0

    def encode(self) -> bytes:
        """The JSON object stored in Tier 2."""
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> NodeRecord:
        """Parse a stored record; ValueError if it is not one this version reads."""
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a registry record of format {RECORD_FORMAT}")
        fields = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**fields)

    def state_at(self, now_ms: int, down_after: float) -> str:
        """up, down (no heartbeat for ``down_after`` seconds) or stopped."""
        if self.state == STOPPED:
            return STOPPED
        return DOWN if now_ms - self.heartbeat_at_ms > down_after * 1000 else UP

    def heartbeat_age(self, now_ms: int) -> float:
        """Seconds since the last heartbeat (by the reader's clock)."""
        return max(0.0, (now_ms - self.heartbeat_at_ms) / 1000)


def now_ms() -> int:
    """Wall-clock milliseconds (heartbeats compare clocks across hosts)."""
    return int(time.time() * 1000)


async def read_registry(layer: ChunkLayer, *, deadline: float | None = None) -> list[NodeRecord]:
    """Every readable node record, by node id; unreadable ones are logged and skipped."""
    records = []
    for obj in await layer.list(NODES_PREFIX, deadline=deadline):
        if not obj.key.endswith(".json"):
            continue
        try:
            data = await layer.read(obj.key, 0, max(obj.size, 1), deadline=deadline)
        except ChunkNotFound:
            continue  # removed since the listing
        try:
            records.append(NodeRecord.decode(data))
        except (ValueError, TypeError) as e:
            log.warning("cluster: skipping registry record %s: %s", obj.key, e)
    return sorted(records, key=lambda r: r.id)


async def write_record(layer: ChunkLayer, record: NodeRecord, deadline: float) -> None:
    """Store ``record`` (replacing the node's previous one)."""
    await layer.write(
        record_key(record.id),
        record.encode(),
        {"node": record.id, "epoch": str(record.epoch)},
        deadline=deadline,
    )


async def run_heartbeat(
    layer: ChunkLayer,
    first: NodeRecord,
    interval: float,
    progress: Callable[[], tuple[int, int]],
    keep_going: Callable[[], bool] = lambda: True,
) -> None:
    """Write ``first``, then refresh it every ``interval`` until cancelled.

    ``progress`` gives (segment count, unflushed bytes) for each beat. A
    failed write is logged and tried again at the next beat: a node whose
    Tier 2 is unreachable soon looks down to the others, which is the truth
    as far as they can tell. ``keep_going`` returning False stops the beats
    (a fenced node must not refresh a record later readers would trust).
    """
    import trio

    record = first
    failing = False
    while keep_going():
        segments, unflushed = progress()
        record = replace(
            record, heartbeat_at_ms=now_ms(), segments=segments, unflushed_bytes=unflushed
        )
        try:
            # One beat may not take longer than the bound the others use.
            await write_record(layer, record, deadline=interval)
            if failing:
                log.info("cluster: heartbeat written again")
            failing = False
        except GatewayError as e:
            if not failing:
                log.warning("cluster: heartbeat not written (tried again every %gs): %s",
                            interval, e)  # fmt: skip
            failing = True
        await trio.sleep(interval)


async def write_stopped(
    layer: ChunkLayer, record: NodeRecord, segments: int, unflushed: int
) -> None:
    """At a clean stop: say so, so the others list this node as stopped, not down."""
    stopped = replace(
        record,
        state=STOPPED,
        heartbeat_at_ms=now_ms(),
        segments=segments,
        unflushed_bytes=unflushed,
    )
    try:
        await write_record(layer, stopped, deadline=5.0)
    except GatewayError as e:
        log.warning("cluster: stop not recorded in the registry: %s", e)
