"""Several gateway nodes on one SeaweedFS bucket, each a real daemon with its own mount."""

from __future__ import annotations

import json
import pathlib
import socket
import uuid

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from tests.helpers.mount import MountedDaemon, stop_all

NODES = ("node-a", "node-b", "node-c")
KiB = 1024
MiB = 1024 * KiB


SMALL_PREALLOCATION = 'preallocate_step = "1 MiB"\n'


def node_config(
    node: str, bucket: str, endpoint: str, journal: str = SMALL_PREALLOCATION, cluster: str = ""
) -> str:
    """A node of the test cluster: short heartbeats and refreshes, flushes only when asked.

    ``journal`` is the body of its ``[journal]`` table, ``cluster`` more keys of
    its ``[cluster]`` table. By default journal files
    (and replica logs) grow in small steps: a test session keeps hundreds of
    killed nodes' directories on disk at once.
    """
    return f"""
[node]
id = "{node}"
[tier2]
url = "s3://{bucket}/gw"
endpoint_url = "{endpoint}"
flush_interval = "24h"
snapshot_interval = 0
retry_deadline = "5s"
[cluster]
heartbeat_interval = "0.5s"
down_after = "3s"
refresh_interval = "0.25s"
lease = "2s"
{cluster}[fuse]
active_timeout = "0.2s"
[journal]
{journal}"""


class Cluster:
    """Three mounted daemons on one bucket."""

    def __init__(self, root: pathlib.Path, s3: EmbeddedS3, nodes: tuple[str, ...] = NODES) -> None:
        self.bucket = f"cl-{uuid.uuid4().hex[:12]}"
        from gateway.storage.s3 import S3Storage

        storage = S3Storage(
            self.bucket,
            endpoint_url=s3.endpoint_url,
            access_key=s3.access_key,
            secret_key=s3.secret_key,
        )
        storage.create_bucket_if_missing()
        storage.close()
        self.env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        self.daemons = {
            n: MountedDaemon(
                root / n,
                root / f"{n}-mnt",
                config_text=node_config(n, self.bucket, s3.endpoint_url),
                env=self.env,
            )
            for n in nodes
        }

    def start(self) -> None:
        """Start every node (each ready with its mount)."""
        for d in self.daemons.values():
            d.start(timeout=60)

    def client(self, node: str) -> SyncClient:
        """A protocol client connected to ``node``."""
        return SyncClient(self.daemons[node].address)

    def teardown(self) -> None:
        """Stop every node and remove its mount, whatever state it is in."""
        stop_all(self.daemons.values())


def record(node: str, advertise: str, heartbeat_ms: int, **changes: object) -> bytes:
    """A registry record as a node writes it (JSON), with ``changes`` applied."""
    doc: dict[str, object] = {
        "format": 1, "id": node, "advertise": advertise, "epoch": 1, "version": "test",
        "started_at_ms": heartbeat_ms, "heartbeat_at_ms": heartbeat_ms, "state": "up",
        "segments": 0, "unflushed_bytes": 0, "host": "test", "pid": 1,
    }  # fmt: skip
    doc.update(changes)
    return json.dumps(doc).encode()


class BlackHole:
    """A TCP port that accepts connections and never answers (a hung process)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)  # the kernel accepts; nobody reads
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()
