"""The node registry: one small record per node in Tier 2, refreshed as a heartbeat.

Nodes that share a Tier-2 bucket and prefix find each other here, with no
other service: each node writes ``_cluster/nodes/<node id>.json`` when it
starts and again every ``cluster.heartbeat_interval``, and marks it
``stopped`` when it stops cleanly. A node whose last heartbeat is older than
``cluster.down_after`` is *down* (crashed, cut off, or its host gone).

Whether a node is up does not depend on clocks agreeing: a reader calls a
node down once its record has not *changed* for ``down_after`` by the
reader's own monotonic clock (`Liveness`). The writer's wall-clock time in
the record only places a record seen for the first time (a heartbeat from
the future counts as fresh then, and goes stale like any other). Every
record is checked field by field (`NodeRecord.decode`); one that is not
usable is skipped and reported once per version (`Rejections`), never
fatal. The record format is in docs/FORMATS.md ("Node registry").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from gateway.config import CLUSTER_PREFIX, parse_host_port
from gateway.errors import ChunkNotFound, GatewayError
from gateway.storage.layer import ChunkLayer
from gateway.tier2.untrusted import BadRecord, Rejections, want_int, want_str

log = logging.getLogger(__name__)

#: Version of the registry record; a reader skips records of a newer major version.
RECORD_FORMAT = 1
NODES_PREFIX = f"{CLUSTER_PREFIX}/nodes/"

#: States a node is listed in.
UP, DOWN, STOPPED = "up", "down", "stopped"
#: A node record is a few hundred bytes; anything far larger is not one.
MAX_RECORD_BYTES = 64 * 1024


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
    #: The node whose host runs this node's container after a takeover or a
    #: drain ("": it runs on its own host). Such a container shares its host's
    #: disk, so it holds no replicas and is not in another node's ensemble.
    hosted_by: str = ""
    #: ``replication.write_quorum``: a node whose journal is on one disk only
    #: (1) is never taken over (its unflushed tail would be lost).
    write_quorum: int = 1

    def encode(self) -> bytes:
        """The JSON object stored in Tier 2."""
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, key_node: str | None = None) -> NodeRecord:
        """Parse a stored record, field by field; `BadRecord` saying why if unusable.

        ``key_node``: the node id the record's key names, which its ``id``
        must match. Fields this version does not know are ignored.
        """
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise BadRecord(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRecord(f"not a JSON object but {type(doc).__name__}")
        version = want_int(doc, "format", high=1 << 31)
        if version != RECORD_FORMAT:
            raise BadRecord(f"record format {version}; this version reads {RECORD_FORMAT}")
        node = want_str(doc, "id", max_len=255)
        if key_node is not None and node != key_node:
            raise BadRecord(f"its id {node!r} is not the node its key names ({key_node!r})")
        advertise = want_str(doc, "advertise", max_len=1024)
        try:
            parse_host_port(advertise)
        except ValueError as e:
            raise BadRecord(f"field 'advertise': {e}") from None
        state = want_str(doc, "state", max_len=32)
        if state not in (UP, STOPPED):
            raise BadRecord(f"field 'state' is {state!r}, not {UP!r} or {STOPPED!r}")
        return cls(
            id=node,
            advertise=advertise,
            epoch=want_int(doc, "epoch"),
            version=want_str(doc, "version", max_len=256),
            started_at_ms=want_int(doc, "started_at_ms"),
            heartbeat_at_ms=want_int(doc, "heartbeat_at_ms"),
            state=state,
            segments=want_int(doc, "segments") if "segments" in doc else 0,
            unflushed_bytes=want_int(doc, "unflushed_bytes") if "unflushed_bytes" in doc else 0,
            host=want_str(doc, "host", default="", max_len=1024),
            pid=want_int(doc, "pid", high=1 << 32) if "pid" in doc else 0,
            hosted_by=want_str(doc, "hosted_by", default="", max_len=255),
            write_quorum=want_int(doc, "write_quorum", low=1, high=15)
            if "write_quorum" in doc
            else 1,
        )

    @property
    def domain(self) -> str:
        """The host this node's container runs on, by node id: what fails together."""
        return self.hosted_by or self.id


async def read_record(
    layer: ChunkLayer, node: str, deadline: float | None = None
) -> NodeRecord | None:
    """``node``'s registry record, if there is a usable one."""
    try:
        data = await layer.read(record_key(node), 0, MAX_RECORD_BYTES, deadline=deadline)
    except ChunkNotFound:
        return None
    try:
        return NodeRecord.decode(data, key_node=node)
    except BadRecord:
        return None


def now_ms() -> int:
    """Wall-clock milliseconds (heartbeats compare clocks across hosts)."""
    return int(time.time() * 1000)


async def read_registry(
    layer: ChunkLayer, *, deadline: float | None = None, rejections: Rejections | None = None
) -> list[NodeRecord]:
    """Every usable node record, by node id; the others are reported and skipped."""
    rejections = rejections or Rejections()
    records = []
    listing = await layer.list(NODES_PREFIX, deadline=deadline)
    for obj in listing:
        name = obj.key[len(NODES_PREFIX) :]
        if not name.endswith(".json") or "/" in name:
            rejections.reject("node record", obj.key, "not a node record's key", obj.key)
            continue
        version = (obj.size, obj.mtime)
        if obj.size > MAX_RECORD_BYTES:
            rejections.reject("node record", obj.key, f"{obj.size} bytes is too large", version)
            continue
        try:
            # Not the listed size: a heartbeat may have rewritten the record
            # since the listing, longer, and its first bytes are no record.
            data = await layer.read(obj.key, 0, MAX_RECORD_BYTES + 1, deadline=deadline)
        except ChunkNotFound:
            continue  # removed since the listing
        if len(data) > MAX_RECORD_BYTES:
            rejections.reject("node record", obj.key, f"more than {MAX_RECORD_BYTES} bytes",
                              version)  # fmt: skip
            continue
        try:
            record = NodeRecord.decode(data, key_node=name[: -len(".json")])
        except BadRecord as e:
            rejections.reject("node record", obj.key, str(e), version)
            continue
        rejections.accept("node record", obj.key)
        records.append(record)
    rejections.forget_missing("node record", {o.key for o in listing})
    return sorted(records, key=lambda r: r.id)


class Liveness:
    """Which nodes are up, by this node's own clock: a record that keeps changing.

    A node is *up* while its record changed (a new heartbeat) within
    ``down_after`` seconds of this node's monotonic clock, so neither a
    clock that runs ahead (a heartbeat "from the future") nor one behind
    keeps a silent node up, or a live one down. A record seen for the first
    time is placed by its heartbeat's age by the wall clock, never younger
    than 0 (this node may have just started while the other beats on).
    """

    def __init__(self, down_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.down_after = down_after
        self.clock = clock
        #: node id -> (heartbeat value last seen, local time it changed).
        self._seen: dict[str, tuple[int, float]] = {}
        #: node id -> local time the heartbeat value last seen was first seen
        #: (never backdated by the record's own clock).
        self._first: dict[str, float] = {}
        #: Local time of this node's last failed registry read (`blinded`).
        self._blind_at = float("-inf")
        #: Local time the registry read in progress began (None: none), and
        #: the Tier-2 retry count then.
        self._reading_since: float | None = None
        self._retries_then = 0
        #: A registry read longer than this, with Tier-2 retries meanwhile,
        #: was held up by a failing Tier 2 (`read_done`).
        self.slow_read = 1.0
        #: This node's Tier-2 retries so far (`gateway.storage.layer.ChunkLayer.retries`).
        self.retries: Callable[[], int] = lambda: 0

    def observe(self, record: NodeRecord) -> None:
        """Note ``record`` as read now."""
        seen = self._seen.get(record.id)
        if seen is not None and seen[0] == record.heartbeat_at_ms:
            return
        now = self.clock()
        self._first[record.id] = now
        if seen is None:
            age = max(0.0, (now_ms() - record.heartbeat_at_ms) / 1000)
            self._seen[record.id] = (record.heartbeat_at_ms, now - age)
        else:
            self._seen[record.id] = (record.heartbeat_at_ms, now)

    def age(self, record: NodeRecord) -> float:
        """Seconds since ``record``'s node last showed a new heartbeat (by this clock)."""
        seen = self._seen.get(record.id)
        if seen is None:
            return max(0.0, (now_ms() - record.heartbeat_at_ms) / 1000)
        return max(0.0, self.clock() - seen[1])

    def watched(self, record: NodeRecord) -> float:
        """Seconds this node has itself watched ``record``'s heartbeat stay the same.

        Unlike `age`, never more than this node has been looking: what a
        takeover decides on (a record first seen just now may be old by its
        writer's clock, and fresh by the truth).
        """
        seen = self._seen.get(record.id)
        if seen is None or seen[0] != record.heartbeat_at_ms:
            return 0.0
        now = self.clock()
        if self._held_up(now):
            return 0.0  # blind right now: the read in progress is being retried
        since = max(self._first.get(record.id, now), self._blind_at)
        return max(0.0, now - since)

    def read_started(self) -> None:
        """A registry read begins (`read_done` when it ends)."""
        self._reading_since = self.clock()
        self._retries_then = self.retries()

    def read_done(self, ok: bool) -> None:
        """The registry read ended: failed, or held up by retries, it made this node blind."""
        held_up = self._held_up(self.clock())
        self._reading_since = None
        if not ok or held_up:
            self.blinded()

    def _held_up(self, now: float) -> bool:
        # Slow alone is not enough (a large registry on a busy node); slow
        # while Tier 2 requests were failing and being retried is.
        started = self._reading_since
        return (
            started is not None
            and now - started > self.slow_read
            and self.retries() > self._retries_then
        )

    def blinded(self) -> None:
        """This node could not read the registry: what it watched so far proves nothing.

        A record that did not change while this node could not read Tier 2
        either was most likely not written for the same reason (an S3
        outage stops every node's heartbeat at once); `watched` counts
        again from the next successful read, so that an outage longer than
        ``down_after`` does not make every node take the others over.
        """
        self._blind_at = self.clock()

    def state(self, record: NodeRecord) -> str:
        """up, down (no new heartbeat for ``down_after``) or stopped."""
        if record.state == STOPPED:
            return STOPPED
        return DOWN if self.age(record) > self.down_after else UP

    def forget(self, node_id: str) -> None:
        """The record is gone."""
        self._seen.pop(node_id, None)
        self._first.pop(node_id, None)


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
