"""Three (or more) replicating daemons on one SeaweedFS bucket (no mounts unless asked)."""

from __future__ import annotations

import pathlib
import shutil
import uuid

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from tests.helpers.cluster import SMALL_PREALLOCATION, node_config
from tests.helpers.daemon import Daemon, scrape
from tests.helpers.mount import MountedDaemon, stop_all
from tests.helpers.wait import wait_for


def replicated_config(
    node: str, bucket: str, endpoint: str, write_quorum: int = 3, ack_quorum: int = 2,
    extra: str = "", journal: str = SMALL_PREALLOCATION, takeover: bool = False,
) -> str:  # fmt: skip
    """A node of the test cluster replicating its journal (short timeouts).

    ``extra`` is appended TOML; ``journal`` the body of the ``[journal]`` table.
    ``takeover``: survivors take a down node's container over (off by default
    here: most tests rebuild or restart a node by hand).
    """
    return (
        node_config(
            node, bucket, endpoint, journal, f"takeover = {'true' if takeover else 'false'}\n"
        )
        + f"""
[replication]
write_quorum = {write_quorum}
ack_quorum = {ack_quorum}
ack_timeout = "3s"
peer_timeout = "1s"
"""
        + extra
    )


class ReplicatedCluster:
    """Daemons sharing one bucket, each replicating its journal to the others."""

    def __init__(
        self,
        root: pathlib.Path,
        s3: EmbeddedS3,
        nodes: tuple[str, ...] = ("node-a", "node-b", "node-c"),
        write_quorum: int = 3,
        ack_quorum: int = 2,
        mounts: bool = False,
        extra: str = "",
        endpoints: dict[str, str] | None = None,
        journal: str = SMALL_PREALLOCATION,
        takeover: bool = False,
    ) -> None:
        from gateway.storage.s3 import S3Storage

        self.root = root
        self.s3 = s3
        self.bucket = f"rep-{uuid.uuid4().hex[:12]}"
        storage = S3Storage(
            self.bucket,
            endpoint_url=s3.endpoint_url,
            access_key=s3.access_key,
            secret_key=s3.secret_key,
        )
        storage.create_bucket_if_missing()
        storage.close()
        self.env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        self.daemons: dict[str, Daemon] = {}
        for n in nodes:
            endpoint = (endpoints or {}).get(n, s3.endpoint_url)
            text = replicated_config(
                n, self.bucket, endpoint, write_quorum, ack_quorum, extra, journal, takeover
            )
            if mounts:
                self.daemons[n] = MountedDaemon(
                    root / n, root / f"{n}-mnt", config_text=text, env=self.env
                )
            else:
                self.daemons[n] = Daemon(root / n, text, env=self.env)

    def start(self) -> None:
        """Start every node, then wait until each has a full ensemble."""
        for d in self.daemons.values():
            d.start(timeout=60)
        for n in self.daemons:
            self.wait_ensemble(n)

    def wait_ensemble(self, node: str, size: int | None = None, timeout: float = 30.0) -> None:
        """Until ``node``'s recorded ensemble has ``size`` live members (default: all others)."""
        want = len(self.daemons) - 1 if size is None else size
        want = min(want, 2) if size is None else want

        def full() -> bool:
            m = scrape(self.daemons[node].metrics_port)
            return (
                m.get("segment_gateway_replication_ensemble_size", 0) >= want
                and m.get("segment_gateway_replication_quorum", 0) == 1
            )

        wait_for(full, timeout, f"{node}'s ensemble of {want}")

    def replacement(self, node: str) -> Daemon:
        """Another host for ``node``: a fresh data dir and port, the real S3 endpoint."""
        text = replicated_config(node, self.bucket, self.s3.endpoint_url)
        d = Daemon(self.root / f"{node}-new", text, env=self.env)
        return d

    def client(self, node: str) -> SyncClient:
        """A protocol client connected to ``node``."""
        return SyncClient(self.daemons[node].address)

    def destroy_data(self, node: str) -> None:
        """What a dead disk leaves: the node's data directory without its data."""
        d = self.daemons[node]
        for entry in d.data_dir.iterdir():
            if entry.name in ("gateway.toml", "daemon.log"):
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def teardown(self) -> None:
        """Kill every node and remove its mount, whatever state it is in (`stop_all`)."""
        stop_all(self.daemons.values(), timeout=0)
