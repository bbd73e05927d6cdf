"""Taking a node id over from Tier 2 fences the old process, on another host or this one.

Two live processes with the same node id on one bucket: the old one (the
zombie) keeps running while a second one rebuilds the node's metadata from
Tier 2 (``serve --recover-from-tier2``) with a higher epoch. From then on the
zombie accepts no change, uploads nothing readers would trust, says so in its
log, and cannot start again; an observer node follows the new process.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, Unavailable
from tests.helpers.cluster import MiB, node_config
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.mount import MountedDaemon, require_fuse
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def bucket(seaweedfs: EmbeddedS3) -> Iterator[tuple[str, dict[str, str]]]:
    from gateway.storage.s3 import S3Storage

    name = f"fence-{uuid.uuid4().hex[:12]}"
    storage = S3Storage(
        name,
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    storage.create_bucket_if_missing()
    yield (
        name,
        {
            "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
            "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key,
        },
    )
    storage.close()


@pytest.mark.expect_errors(r"node node-z \(epoch \d+\) has been taken over by epoch \d+")
def test_a_takeover_fences_the_live_old_process(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, bucket: tuple[str, dict[str, str]]
) -> None:
    require_fuse()
    name, env = bucket
    config = node_config("node-z", name, seaweedfs.endpoint_url)
    observer = MountedDaemon(
        tmp_path / "obs",
        tmp_path / "obs-mnt",
        config_text=node_config("node-obs", name, seaweedfs.endpoint_url),
        env=env,
    )
    zombie = Daemon(tmp_path / "old", config_text=config, env=env)
    heir = Daemon(tmp_path / "new", config_text=config, env=env)
    try:
        zombie.start(timeout=60)
        observer.start(timeout=60)
        data = b"flushed line\n" * (MiB // 13)
        with SyncClient(zombie.address) as c:
            c.create("z/data")
            c.append("z/data", data)
            c.flush("z/data")
            c.append("z/data", b"only in the old journal\n")
        seen = observer.mnt / "z/data"
        wait_for(lambda: seen.exists() and seen.stat().st_size == len(data) + 24, 5,
                 "the segment on the observer")  # fmt: skip

        # The old host is cut off, not dead; its node id is taken over elsewhere.
        heir.start(timeout=60, serve_args=("--recover-from-tier2",))
        wait_for(lambda: "has been taken over" in zombie.log(), 10, "the zombie noticing")
        assert zombie.alive()
        with SyncClient(zombie.address) as c:
            with pytest.raises(Unavailable, match="has been taken over"):
                c.append("z/data", b"lost write\n")
            with pytest.raises(GatewayError, match="has been taken over"):
                c.create("z/other")
            with pytest.raises(GatewayError, match="has been taken over"):
                c.flush("z/data")

        # The observer follows the new process: its address, its epoch,
        # what Tier 2 held (the old journal's tail is gone with it).
        def heir_listed() -> bool:
            r = run_cli("cluster", "--connect", observer.address, "--json")
            nodes = {n["id"]: n for n in map(json.loads, r.stdout.splitlines())}
            z = nodes.get("node-z")
            return bool(z and z["advertise"] == heir.address and z["state"] == "up")

        wait_for(heir_listed, 10, "the new process in the registry")
        wait_for(
            lambda: (
                seen.stat().st_size == len(data)
                and os.getxattr(seen, "user.segment.tail_available") == b"1"
            ),
            10,
            "the view of the new process",
        )
        assert seen.read_bytes() == data
        # Changes sent to the observer go to the new owner.
        with SyncClient(observer.address) as c:
            assert c.append("z/data", b"after\n").offset == len(data)
        with SyncClient(heir.address) as c:
            assert c.read("z/data", len(data), 100).data == b"after\n"

        # The zombie cannot come back under this id.
        zombie.stop(timeout=30)
        with pytest.raises(RuntimeError, match="has been taken over"):
            zombie.start(timeout=60)
        assert zombie.proc is not None and zombie.proc.returncode == 31
    finally:
        for d in (heir, zombie, observer):
            if isinstance(d, MountedDaemon):
                d.teardown()
            else:
                d.kill()
