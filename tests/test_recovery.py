"""Backup, restore and disaster recovery of a node's metadata, with real daemons.

- export/import round trip: a node's metadata exported (to a file and to
  S3), imported on an empty node with the same Tier 2, which then serves
  every segment byte-exact with its state and attributes;
- disaster recovery: a node killed with ``kill -9`` loses its journal and
  cache directories, and ``serve --recover-from-tier2`` rebuilds it from the
  newest snapshot plus the chunks written after it (on SeaweedFS, and on the
  filesystem binding, whose chunks grow in place);
- refusals: a node that has a journal, a snapshot of another node, nothing
  in Tier 2.

The rebuild rules themselves are tested object by object in
tests/test_tier2_recovery.py.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from gateway.client.sync import SyncClient
from gateway.container import AttributeUpdate, Verb
from gateway.protocol.metadata_pb2 import MetadataSnapshot
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.snapshots import newest_metadata
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3
    from gateway.storage.interface import ChunkStorage

KiB = 1024
NODE = "node-1"
#: A custom attribute (a client's), to see attributes survive.
ATTR = b"\x10" * 16


def cli(
    config: pathlib.Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``segment-gateway --config CONFIG ARGS...``."""
    return run_cli("--config", str(config), *args, env=env)


def newest_snapshot(storage: ChunkStorage) -> MetadataSnapshot | None:
    found = newest_metadata(storage, NODE)
    return None if found is None else found[1]


def chunk_keys(storage: ChunkStorage) -> set[str]:
    return {o.key for o in storage.list(names.chunks_prefix(NODE))}


def read_all(client: SyncClient, name: str) -> bytes:
    """The segment's bytes from its start offset, through the protocol."""
    info = client.info(name)
    if info.length == info.start_offset:
        return b""
    return client.read(name, info.start_offset, info.length - info.start_offset).data


def snapshot_matches(storage: ChunkStorage, client: SyncClient) -> bool:
    """The newest snapshot in Tier 2 shows every segment as the daemon does now."""
    snap = newest_snapshot(storage)
    if snap is None:
        return False
    seen = {(s.name, s.length, s.storage_length, len(s.chunks)) for s in snap.container.segments}
    live = {(i.name, i.length, i.storage_length, i.chunk_count) for i in client.list()}
    return seen == live


def stop_snapshots(daemon: Daemon, config: str) -> None:
    """Reload with snapshot_interval = 1h: no snapshot starts after this returns."""
    daemon.config_path.write_text(config.replace('"0s"', '"1h"'))
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reloaded: tier2.snapshot_interval" in daemon.log(), 20, "the reload")


@pytest.fixture
def s3_node(
    tmp_path: pathlib.Path, s3_storage: S3Storage, seaweedfs: EmbeddedS3
) -> Iterator[tuple[str, dict[str, str], S3Storage]]:
    """Tier-2 configuration on the session's SeaweedFS (prefix "p"), credentials, and a
    binding on the same prefix to look at the objects."""
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    config = (
        f'[tier2]\nurl = "s3://{s3_storage.bucket}/p"\nendpoint_url = "{seaweedfs.endpoint_url}"\n'
        'flush_size = "64 KiB"\nmax_chunk_size = "64 KiB"\nflush_interval = "1h"\n'
        'snapshot_interval = "0s"\n'
    )
    view = S3Storage(
        s3_storage.bucket,
        "p",
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    yield config, env, view
    view.close()


@pytest.mark.timeout(120)
def test_export_import_round_trip(
    tmp_path: pathlib.Path, s3_node: tuple[str, dict[str, str], S3Storage]
) -> None:
    config, env, view = s3_node
    rng = random.Random(11)
    sizes = {"logs/a": 150 * KiB, "logs/b": 200 * KiB, "c": 30 * KiB, "empty": 0}
    data = {name: rng.randbytes(size) for name, size in sizes.items()}
    old = Daemon(tmp_path / "old", config, env=env)
    old.start()
    try:
        with SyncClient(old.address) as c:
            for name, blob in data.items():
                c.create(name)
                for i in range(0, len(blob), 50 * KiB):
                    update = AttributeUpdate(ATTR, Verb.ACCUMULATE, 1)
                    c.append(name, blob[i : i + 50 * KiB], attribute_updates=[update])
            c.seal("logs/a")
            c.truncate("logs/b", 130 * KiB)
            c.flush()
            before = {i.name: i for i in c.list()}
            attrs = {n: c.get_attributes(n) for n in data}
        exported = tmp_path / "meta.pb"
        r = cli(
            old.config_path, "export-metadata", "--connect", old.address, "--out", str(exported)
        )
        assert r.returncode == 0, r.stderr
        assert "4 segment(s)" in r.stderr
        backup = f"s3://{view.bucket}/backups/meta.json"
        r = cli(old.config_path, "export-metadata", "--connect", old.address, "--json",
                "--out", backup, env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert old.stop() == 0
    finally:
        old.kill()
    # Offline, from the stopped node's journal: the same metadata.
    offline = tmp_path / "offline.pb"
    r = cli(old.config_path, "export-metadata", "--offline", "--data-dir", str(old.data_dir),
            "--out", str(offline))  # fmt: skip
    assert r.returncode == 0, r.stderr
    online = MetadataSnapshot.FromString(exported.read_bytes())
    assert MetadataSnapshot.FromString(offline.read_bytes()).container == online.container

    # A new, empty node with the same node id and Tier 2 imports the S3 copy.
    new = Daemon(tmp_path / "new", config, env=env)
    r = cli(new.config_path, "import-metadata", "--data-dir", str(new.data_dir), backup, env=env)
    assert r.returncode == 0, r.stderr
    assert "imported 4 segment(s)" in r.stdout
    new.start()
    try:
        with SyncClient(new.address) as c:
            after = {i.name: i for i in c.list()}
            assert after.keys() == before.keys()
            for name, info in before.items():
                # attribute_count counts the values memory holds; the attribute
                # index in Tier 2 has the rest, and all of them come back.
                assert replace(after[name], attribute_count=0) == replace(
                    info, attribute_count=0
                ), name
                assert c.get_attributes(name) == attrs[name]
                got = read_all(c, name)
                assert got == data[name][info.start_offset :], name
            assert c.get_attributes("logs/b")[ATTR] == 4
            # It goes on: a new chunk of a new epoch, above every old one.
            c.append("c", b"more")
            c.flush("c")
            assert read_all(c, "c") == data["c"] + b"more"
            epochs = [names.chunk_epoch(k) or 0 for k in chunk_keys(view)]
            assert sorted(epochs)[-1] > online.epoch and epochs.count(sorted(epochs)[-1]) == 1
        # Importing again is refused: the node has a journal now.
        r = cli(new.config_path, "import-metadata", "--data-dir", str(new.data_dir),
                str(exported), env=env)  # fmt: skip
        assert r.returncode == 29 and "holds a journal" in r.stderr
        assert new.stop() == 0
    finally:
        new.kill()


@pytest.mark.timeout(150)
def test_disaster_recovery_from_s3_only(
    tmp_path: pathlib.Path, s3_node: tuple[str, dict[str, str], S3Storage]
) -> None:
    config, env, view = s3_node
    rng = random.Random(12)
    blob = {n: rng.randbytes(200 * KiB) for n in ("sealed", "trunc", "grow", "doomed")}
    tail = rng.randbytes(15 * KiB)
    new_data = rng.randbytes(30 * KiB)
    node = Daemon(tmp_path / "node", config, env=env)
    node.start()
    try:
        with SyncClient(node.address) as c:
            # Before the snapshot.
            for name in ("sealed", "trunc", "grow", "doomed", "tail", "deleted-early"):
                c.create(name)
            for name, b in blob.items():
                for i in range(0, len(b), 40 * KiB):
                    c.append(name, b[i : i + 40 * KiB])
            c.append("tail", tail[: 10 * KiB])
            c.append("deleted-early", b"x" * 1000)
            c.flush("deleted-early")
            c.delete("deleted-early")
            c.seal("sealed")
            c.append("grow", b"", attribute_updates=[AttributeUpdate(ATTR, Verb.REPLACE, 7)])
            c.flush()
            # In the snapshot's length, never in Tier 2: the snapshot comes after
            # the flush of another segment.
            c.append("tail", tail[10 * KiB :])
            c.create("late")
            c.append("late", b"late")
            c.flush("late")
            wait_for(lambda: snapshot_matches(view, c), 20, "a snapshot of it all")
            stop_snapshots(node, config)
            snap = newest_snapshot(view)
            assert snap is not None and snapshot_matches(view, c)
            (trunc,) = [s for s in snap.container.segments if s.name == "trunc"]
            (doomed,) = [s for s in snap.container.segments if s.name == "doomed"]
            # Truncating at 150 KiB deletes the chunks that end below it.
            trunc_gone = {k.name for k in trunc.chunks if k.start_offset + k.length <= 150 * KiB}
            trunc_start = min(k.start_offset for k in trunc.chunks if k.name not in trunc_gone)
            assert trunc_gone and trunc_start < 150 * KiB

            # After the snapshot: only chunks (and their metadata) record these.
            more = rng.randbytes(100 * KiB)
            for i in range(0, len(more), 40 * KiB):
                c.append("grow", more[i : i + 40 * KiB])
            c.truncate("trunc", 150 * KiB)
            c.delete("doomed")
            c.create("new")
            c.append("new", new_data)
            c.flush("grow")
            c.flush("new")  # not "tail": its last 5 KiB stay in the journal only
            c.create("journal-only")
            c.append("journal-only", b"lost")
            doomed_gone = {k.name for k in doomed.chunks}
            wait_for(lambda: not chunk_keys(view) & (trunc_gone | doomed_gone), 20, "the deletes")
            before = {i.name: i for i in c.list()}
        # No snapshot knows of anything after the reload.
        last = newest_snapshot(view)
        assert last is not None and {s.name for s in last.container.segments} == {
            "sealed", "trunc", "grow", "doomed", "tail", "late"
        }  # fmt: skip
        node.kill()
    finally:
        node.kill()

    # The SSD is lost.
    shutil.rmtree(node.data_dir / "journal")
    shutil.rmtree(node.data_dir / "cache")
    node.start(serve_args=("--recover-from-tier2",))
    try:
        log = node.log_path.read_text()
        assert "'tail': LOST 5120 byte(s)" in log
        assert "'doomed' left out" in log
        with SyncClient(node.address) as c:
            after = {i.name: i for i in c.list()}
            assert set(after) == {"sealed", "trunc", "grow", "tail", "late", "new"}
            assert after["sealed"].sealed and read_all(c, "sealed") == blob["sealed"]
            # The truncation offset is not in Tier 2: the first chunk left says
            # where the segment starts now.
            assert after["trunc"].start_offset == trunc_start
            assert read_all(c, "trunc") == blob["trunc"][trunc_start:]
            assert read_all(c, "grow") == blob["grow"] + more
            assert c.get_attributes("grow")[ATTR] == 7
            assert read_all(c, "tail") == tail[: 10 * KiB]
            assert read_all(c, "new") == new_data
            for name in ("sealed", "grow", "new"):
                assert after[name].length == before[name].length, name
            # It goes on, above every epoch Tier 2 has seen.
            old_keys = chunk_keys(view)
            c.append("new", b"after")
            c.flush("new")
            assert read_all(c, "new") == new_data + b"after"
            (fresh,) = chunk_keys(view) - old_keys
            assert (names.chunk_epoch(fresh) or 0) > max(
                names.chunk_epoch(k) or 0 for k in old_keys
            )
        assert node.stop() == 0
        # A plain restart goes on from the recovered journal.
        node.start()
        with SyncClient(node.address) as c:
            assert read_all(c, "new") == new_data + b"after"
            assert read_all(c, "grow") == blob["grow"] + more
        assert node.stop() == 0
    finally:
        node.kill()


@pytest.mark.timeout(90)
def test_disaster_recovery_on_the_filesystem_binding(tmp_path: pathlib.Path) -> None:
    """Chunks grow in place here: the snapshot names a chunk that is longer now."""
    root = tmp_path / "tier2"
    config = (
        f'[tier2]\nurl = "file://{root}"\nflush_size = "1 MiB"\nflush_interval = "1h"\n'
        'snapshot_interval = "0s"\n'
    )
    storage = FileStorage(root)
    rng = random.Random(13)
    data = rng.randbytes(300 * KiB)
    node = Daemon(tmp_path / "node", config)
    node.start()
    try:
        with SyncClient(node.address) as c:
            c.create("a")
            c.append("a", data[: 100 * KiB])
            c.flush()
            wait_for(lambda: snapshot_matches(storage, c), 20, "a snapshot")
            stop_snapshots(node, config)
            c.append("a", data[100 * KiB : 250 * KiB])
            c.flush()
            assert c.info("a").chunk_count == 1  # the same chunk, grown
            c.append("a", data[250 * KiB :])
        node.kill()
    finally:
        node.kill()
    shutil.rmtree(node.data_dir / "journal")
    shutil.rmtree(node.data_dir / "cache")
    # The offline variant: rebuild without serving, then a plain start.
    r = cli(node.config_path, "import-metadata", "--from-tier2", "--data-dir", str(node.data_dir))
    assert r.returncode == 0, r.stderr
    assert "'a': 153600 byte(s) from chunks newer than the snapshot" in r.stdout
    node.start()
    try:
        with SyncClient(node.address) as c:
            assert read_all(c, "a") == data[: 250 * KiB]
            c.append("a", b"!")
            c.flush()
            assert c.info("a").chunk_count == 2  # a new epoch never appends to an old chunk
            assert read_all(c, "a") == data[: 250 * KiB] + b"!"
        assert node.stop() == 0
    finally:
        node.kill()


def test_refusals(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "tier2"
    config = f'[tier2]\nurl = "file://{root}"\n'
    node = Daemon(tmp_path / "node", config)
    # Nothing in Tier 2: most likely the wrong bucket or node id.
    r = cli(node.config_path, "serve", "--data-dir", str(node.data_dir), "--mountpoint", "",
            "--listen", "127.0.0.1:0", "--metrics-listen", "", "--recover-from-tier2")  # fmt: skip
    assert r.returncode == 30, r.stderr
    assert "no usable metadata snapshot and no chunk" in r.stderr
    assert not list((node.data_dir / "journal").glob("*.wal"))
    # A node with a journal is never rebuilt.
    node.start()
    with SyncClient(node.address) as c:
        c.create("s")
        c.append("s", b"data")
        c.flush()
        snapshot = c.export_metadata()
    assert node.stop() == 0
    r = cli(node.config_path, "serve", "--data-dir", str(node.data_dir), "--mountpoint", "",
            "--listen", "127.0.0.1:0", "--metrics-listen", "", "--recover-from-tier2")  # fmt: skip
    assert r.returncode == 29 and "holds a journal" in r.stderr, r.stderr
    exported = tmp_path / "meta.pb"
    exported.write_bytes(snapshot.SerializeToString())
    r = cli(node.config_path, "import-metadata", "--data-dir", str(node.data_dir), str(exported))
    assert r.returncode == 29
    # Another node's snapshot names chunks under its own prefix: refused.
    other = tmp_path / "other"
    other.mkdir()
    (other / "gateway.toml").write_text(config + '[node]\nid = "node-2"\n')
    r = cli(other / "gateway.toml", "import-metadata", "--data-dir", str(other), str(exported))
    assert r.returncode == 2 and "of node 'node-1', this is 'node-2'" in r.stderr
    r = cli(other / "gateway.toml", "import-metadata", "--data-dir", str(other))
    assert r.returncode == 2
    # A Tier 2 that holds none of the export's chunks is not the exporter's.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gateway.toml").write_text(f'[tier2]\nurl = "file://{tmp_path}/other-tier2"\n')
    r = cli(elsewhere / "gateway.toml", "import-metadata", "--data-dir", str(elsewhere),
            str(exported))  # fmt: skip
    assert r.returncode == 30 and "holds none of the 1 chunk(s)" in r.stderr, r.stderr
    assert not list((elsewhere / "journal").glob("*.wal"))
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff" * 10)
    r = cli(other / "gateway.toml", "import-metadata", "--data-dir", str(other), str(garbage))
    assert r.returncode == 2 and "not a usable metadata snapshot" in r.stderr
