"""The lease and the fence against real daemons: a node that cannot prove it owns its id stops.

- A node cut off from Tier 2 stops acknowledging within ``cluster.lease``
  (2 s here) of its last confirmation, and takes appends again once Tier 2
  is back; nothing it acknowledged is lost.
- A takeover (``serve --recover-from-tier2``) of a node whose old process is
  alive but cut off: the old process acknowledges nothing after the new one
  serves; what it "uploads" after the fence (a snapshot naming a segment the
  new owner never had, a chunk of it) is trusted by no follower and no later
  recovery.
- A copied data directory started beside the original refuses to start,
  saying why, and the original keeps its registry record.

Each node reaches SeaweedFS through its own fault proxy where the test cuts
it off (tests/helpers/s3proxy.py: its upstream repointed at a closed port).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c
import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, SegmentNotFound
from gateway.protocol.metadata_pb2 import ChunkRecord, ContainerSnapshot, SegmentRecord
from gateway.storage import object_keys as names
from gateway.storage.s3 import S3Storage
from gateway.tier2.snapshots import SNAPSHOT_VERSION, build_snapshot, object_metadata
from tests.helpers.cluster import MiB, node_config
from tests.helpers.daemon import Daemon, free_port, run_cli
from tests.helpers.mount import MountedDaemon, require_fuse
from tests.helpers.s3proxy import S3FaultProxy
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LEASE = 2.0


@pytest.fixture
def bucket(seaweedfs: EmbeddedS3) -> Iterator[tuple[str, S3Storage, dict[str, str]]]:
    name = f"lease-{uuid.uuid4().hex[:12]}"
    storage = S3Storage(
        name,
        "gw",
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    storage.create_bucket_if_missing()
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    yield name, storage, env
    storage.close()


@pytest.fixture
def proxy(seaweedfs: EmbeddedS3) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(seaweedfs.endpoint_url) as p:
        yield p


def cut(proxy: S3FaultProxy) -> None:
    """Tier 2 unreachable for whoever goes through ``proxy`` (connections refused)."""
    proxy.set_upstream(f"http://127.0.0.1:{free_port()}")
    proxy.drop(None)  # and requests on connections already open


@dataclass
class Acks:
    """What a writer was told: (time, offset) of each acknowledgement, and refusals."""

    acked: list[tuple[float, int, bytes]] = field(default_factory=list)
    refused: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def last_ack(self) -> float:
        return self.acked[-1][0] if self.acked else 0.0


def keep_appending(address: str, segment: str, acks: Acks) -> threading.Thread:
    """Append numbered lines every 20 ms until ``acks.stop``; record every answer."""

    def run() -> None:
        i = 0
        client: SyncClient | None = None
        while not acks.stop.is_set():
            line = f"{segment} {i:08d}\n".encode()
            try:
                if client is None:
                    client = SyncClient(address)
                r = client.append(segment, line)
                acks.acked.append((time.monotonic(), r.offset, line))
            except GatewayError as e:
                acks.refused.append((time.monotonic(), str(e)))
                if client is not None and "connection" in str(e):
                    client.close()
                    client = None
            i += 1
            acks.stop.wait(0.02)
        if client is not None:
            client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_node_cut_off_from_tier2_stops_acknowledging_within_its_lease(
    tmp_path: pathlib.Path,
    bucket: tuple[str, S3Storage, dict[str, str]],
    proxy: S3FaultProxy,
) -> None:
    name, _, env = bucket
    node = Daemon(tmp_path / "n", config_text=node_config("node-n", name, proxy.endpoint_url),
                  env=env)  # fmt: skip
    acks = Acks()
    try:
        node.start(timeout=60)
        with SyncClient(node.address) as c:
            c.create("cut/seg")
        writer = keep_appending(node.address, "cut/seg", acks)
        wait_for(lambda: len(acks.acked) >= 20, 10, "appends acknowledged")
        cut_at = time.monotonic()
        cut(proxy)
        # Time passing is the subject: the lease runs out while nothing may be acked.
        time.sleep(LEASE + 4)
        during = [t for t, _, _ in acks.acked if t > cut_at]
        # Its last confirmation was sent before the cut: at most LEASE later
        # nothing is acknowledged (plus scheduling on a busy machine).
        assert not during or max(during) <= cut_at + LEASE + 1.0, max(during) - cut_at
        refused = [why for t, why in acks.refused if t > cut_at]
        assert any("cannot confirm in Tier 2 that it still holds epoch" in w for w in refused)
        proxy.clear()
        proxy.set_upstream(proxy.original_upstream)
        back = time.monotonic()
        wait_for(lambda: acks.last_ack() > back, 20, "appends acknowledged again")
        acks.stop.set()
        writer.join(10)
        with SyncClient(node.address) as c:
            for _, offset, line in acks.acked:
                assert c.read("cut/seg", offset, len(line)).data == line
    finally:
        acks.stop.set()
        node.kill()


@pytest.mark.expect_errors(r"node node-z \(epoch \d+\) has been taken over by epoch \d+")
def test_a_takeover_beats_a_cut_off_zombie_and_trusts_nothing_it_writes_after(
    tmp_path: pathlib.Path,
    seaweedfs: EmbeddedS3,
    bucket: tuple[str, S3Storage, dict[str, str]],
    proxy: S3FaultProxy,
) -> None:
    require_fuse()
    name, storage, env = bucket
    direct = node_config("node-z", name, seaweedfs.endpoint_url)
    zombie = Daemon(tmp_path / "old", config_text=node_config("node-z", name, proxy.endpoint_url),
                    env=env)  # fmt: skip
    heir = Daemon(tmp_path / "new", config_text=direct, env=env)
    again = Daemon(tmp_path / "again", config_text=direct, env=env)
    observer = MountedDaemon(tmp_path / "obs", tmp_path / "obs-mnt",
                             config_text=node_config("node-obs", name, seaweedfs.endpoint_url),
                             env=env)  # fmt: skip
    acks = Acks()
    salvages: list[Daemon] = []
    try:
        zombie.start(timeout=60)
        observer.start(timeout=60)
        flushed = b"flushed line\n" * (MiB // 13)
        with SyncClient(zombie.address) as c:
            c.create("z/data")
            c.append("z/data", flushed)
            c.flush("z/data")
            c.create("z/log")
        writer = keep_appending(zombie.address, "z/log", acks)
        wait_for(lambda: len(acks.acked) >= 20, 10, "appends acknowledged by the old process")

        # The old host is cut off from Tier 2, not dead; its id is taken over.
        cut_at = time.monotonic()
        cut(proxy)
        heir.start(timeout=90, serve_args=("--recover-from-tier2",))
        ready_at = time.monotonic()
        # A window after the takeover in which nothing may be acknowledged:
        # proving an absence takes time passing, no event says "none came".
        time.sleep(1.0)
        late = [t for t, _, _ in acks.acked if t > ready_at]
        assert not late, f"the old process acknowledged {len(late)} append(s) after the takeover"
        assert acks.last_ack() <= cut_at + LEASE + 1.0
        assert "waiting" in heir.log() and "lease to run out" in heir.log()
        acks.stop.set()
        writer.join(10)
        assert zombie.alive()
        with SyncClient(heir.address) as c:
            assert c.read("z/data", 0, len(flushed) + 10).data == flushed

        # What the old process might still get into Tier 2 after the fence: a
        # snapshot of its epoch naming a segment the new owner never had, and
        # that segment's chunk.
        fences = sorted(o.key for o in storage.list("_cluster/fence/node-z/"))
        old_epoch = int(fences[-3].rsplit("/", 1)[1])  # the zombie's (then takeover, heir)
        # Tier 2's clock ticks in seconds here: the ghost must be written later
        # than the fence, by Tier 2's own timestamps (time passing is the point).
        time.sleep(1.1)
        ghost = b"a ghost\n"
        chunk = names.chunk_key("node-z", 999, 0, old_epoch)
        crc = crc32c.crc32c(ghost)
        storage.write(chunk, ghost, names.chunk_metadata("z/ghost", 0, len(ghost), crc, old_epoch))
        record = SegmentRecord(
            id=999, name="z/ghost", length=len(ghost), storage_length=len(ghost),
            chunks=[ChunkRecord(name=chunk, start_offset=0, length=len(ghost),
                                crc32c=crc32c.crc32c(ghost), epoch=old_epoch)],
        )  # fmt: skip
        container = ContainerSnapshot(version=SNAPSHOT_VERSION, next_segment_id=1000,
                                      segments=[record])  # fmt: skip
        at_ms = int(time.time() * 1000) + 10**6  # newer than anything the heir wrote
        snap = build_snapshot(container, "node-z", old_epoch, at_ms).SerializeToString()
        storage.write(names.snapshot_key("node-z", at_ms, old_epoch), snap,
                      object_metadata(crc32c.crc32c(snap)))  # fmt: skip

        # The heir dies before it uploads anything more; its own snapshots are
        # gone too (as if it crashed right after the fence): only the fence
        # time separates the old process's late uploads from its real ones.
        heir.kill()
        for key in [o.key for o in storage.list("node-z/meta/")]:
            if names.parse_snapshot_key(key)[1] > old_epoch:  # type: ignore[index]
                storage.delete(key)
        ghost_path = observer.mnt / "z/ghost"
        wait_for(
            lambda: os.getxattr(observer.mnt / "z/data", "user.segment.tail_available") == b"0",
            15,
            "the observer showing what Tier 2 proves",
        )
        # A few refreshes from Tier 2 in which the ghost must not appear: an
        # absence over time, so a pause, not a wait.
        time.sleep(2.0)
        assert not ghost_path.exists()
        assert (observer.mnt / "z/data").read_bytes() == flushed
        obs_log = observer.log_path.read_text()
        assert "stored after epoch" in obs_log and "was fenced" in obs_log

        # Another recovery: not the ghost either.
        again.start(timeout=90, serve_args=("--recover-from-tier2",))
        r = run_cli("ls", "z/", "--connect", again.address)
        assert r.returncode == 0, r.stderr
        assert "z/ghost" not in r.stdout and "z/data" in r.stdout
        assert "stored after epoch" in again.log()

        # Back in touch, the old process finds itself fenced and stays so.
        proxy.clear()
        proxy.set_upstream(proxy.original_upstream)
        wait_for(lambda: "has been taken over" in zombie.log(), 15, "the zombie fenced")
        with SyncClient(zombie.address) as c, pytest.raises(GatewayError, match="taken over"):
            c.append("z/log", b"too late\n")

        # What the old process acknowledged and never flushed is in its data
        # directory: opened as a sandbox node (docs/OPERATIONS.md), it gives
        # back exactly what the new owner lacks.
        zombie.stop(timeout=30)
        salvage = Daemon(zombie.data_dir, config_text='[node]\nid = "node-z-salvage"\n')
        salvages.append(salvage)
        salvage.start(timeout=60)
        with SyncClient(again.address) as c:
            try:
                kept = c.read("z/log", 0, 64 * MiB).data
            except SegmentNotFound:
                kept = b""  # created and appended to, never flushed (flush_interval: 24 h)
        with SyncClient(salvage.address) as c:
            old_length = c.info("z/log").length
            tail = c.read("z/log", len(kept), old_length - len(kept)).data
        assert len(kept) + len(tail) == old_length
        lost = 0
        for _, offset, line in acks.acked:
            if offset < len(kept):
                assert kept[offset : offset + len(line)] == line
            else:
                assert tail[offset - len(kept) : offset - len(kept) + len(line)] == line
                lost += 1
        print(f"takeover: {len(acks.acked)} acknowledged, {lost} only in the old journal")
    finally:
        acks.stop.set()
        for d in (again, heir, zombie, *salvages):
            d.kill()
        observer.teardown()


def test_a_copied_data_directory_refuses_to_start_beside_the_original(
    tmp_path: pathlib.Path,
    seaweedfs: EmbeddedS3,
    bucket: tuple[str, S3Storage, dict[str, str]],
) -> None:
    name, _, env = bucket
    config = node_config("node-c", name, seaweedfs.endpoint_url)
    original = Daemon(tmp_path / "orig", config_text=config, env=env)
    copies = []
    try:
        original.start(timeout=60)
        with SyncClient(original.address) as c:
            c.create("c/data")
            c.append("c/data", b"before the copy\n")
        assert original.stop() == 0
        # A backup restored elsewhere while the original comes back.
        backup = tmp_path / "backup"
        shutil.copytree(original.data_dir, backup, ignore=shutil.ignore_patterns("ready", "*.log"))
        original.start(timeout=60)
        copy = Daemon(backup, config_text=config, env=env)
        copies.append(copy)
        with pytest.raises(RuntimeError, match="this data directory is a copy"):
            copy.start(timeout=60)
        assert copy.proc is not None and copy.proc.returncode == 44

        # A clone of the running machine: a newer epoch, but the original beats.
        clone_dir = tmp_path / "clone"
        shutil.copytree(original.data_dir, clone_dir,
                        ignore=shutil.ignore_patterns("ready", "*.log"))  # fmt: skip
        clone = Daemon(clone_dir, config_text=config, env=env)
        copies.append(clone)
        with pytest.raises(RuntimeError, match="is running elsewhere"):
            clone.start(timeout=60)
        assert clone.proc is not None and clone.proc.returncode == 44
        # The original never lost its place.
        r = run_cli("cluster", "--connect", original.address, "--json")
        (me,) = [n for n in map(json.loads, r.stdout.splitlines()) if n["id"] == "node-c"]
        assert me["advertise"] == original.address and me["state"] == "up"
        with SyncClient(original.address) as c:
            assert c.append("c/data", b"after\n").offset == 16
    finally:
        for d in (original, *copies):
            d.kill()
