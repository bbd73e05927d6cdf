"""Epoch fencing of a node id across hosts (Pravega's epoch fencing, in Tier 2).

Every start of a node registers its journal epoch as the object
``_cluster/fence/<node id>/<epoch, 20 digits>`` (created only if absent).
The node id's *current* epoch is the highest one registered. A node whose
epoch is below it has been taken over -- its metadata rebuilt elsewhere from
Tier 2 (``serve --recover-from-tier2``, ``import-metadata --from-tier2``),
which starts above every epoch registered -- and is *fenced*:

- it refuses to start (`NodeFenced`);
- a process of it still running (a zombie: cut off, not dead) finds the
  higher epoch at its next heartbeat, stops accepting changes, stops
  uploading chunks, snapshots and registry records, and says so in its log;
- readers trust a node's metadata snapshots of the newest epoch only, and
  ignore registry records of a lower epoch than they have seen, so what a
  zombie uploads in the window before it notices is never believed.

Keys are only ever added, so the current epoch only rises, whatever a zombie
writes.
"""

from __future__ import annotations

import json
import os
import socket
import time

from gateway.config import CLUSTER_PREFIX
from gateway.errors import GatewayError
from gateway.tier2.layer import ChunkLayer


class NodeFenced(GatewayError):
    """node {} (epoch {}) has been taken over by epoch {}: this node's journal is \
stale. Do not run it again under this id; its data lives on with the new epoch"""

    exit_code = 31
    wire_code = "UNAVAILABLE"


def fence_prefix(node: str) -> str:
    """Where a node id's registered epochs are."""
    return f"{CLUSTER_PREFIX}/fence/{node}/"


async def current_epoch(layer: ChunkLayer, node: str, deadline: float | None = None) -> int:
    """The highest epoch registered for ``node`` (0: none)."""
    epochs = [
        int(obj.key.rsplit("/", 1)[1])
        for obj in await layer.list(fence_prefix(node), deadline=deadline)
        if obj.key.rsplit("/", 1)[1].isdigit()
    ]
    return max(epochs, default=0)


async def register_epoch(layer: ChunkLayer, node: str, epoch: int) -> None:
    """At start: claim ``epoch`` for ``node``; `NodeFenced` if a higher one exists."""
    current = await current_epoch(layer, node)
    if current > epoch:
        raise NodeFenced(node, epoch, current)
    who = {"host": socket.gethostname(), "pid": os.getpid(), "at_ms": int(time.time() * 1000)}
    body = json.dumps({"node": node, "epoch": epoch, **who}).encode()
    await layer.write_if_absent(f"{fence_prefix(node)}{epoch:020d}", body, {"node": node})
    # A takeover racing with this start: whoever registered higher wins.
    current = await current_epoch(layer, node)
    if current > epoch:
        raise NodeFenced(node, epoch, current)
