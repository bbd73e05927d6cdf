"""`segment-gateway fsck`: every injected fault is found, named, and repaired when it can be.

A node is made once (a real daemon: two segments flushed to the filesystem
binding in several chunks, blocks read into the cache, an unflushed tail
left in the journal) and copied for each test, which damages its copy and
runs the command as an operator would. Every test ends with fsck finding
nothing, or with the exit code of what is left.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from cache import CacheStore
from gateway.client.sync import SyncClient
from gateway.config import DEFAULT_CONFIG_PATH
from gateway.fsck.checks import segment_problems
from gateway.journal.files import list_files
from gateway.journal.format import HEADER_SIZE
from gateway.journal.reader import FrameRecord, mapped, read_frames
from gateway.protocol.metadata_pb2 import ChunkRecord, SegmentRecord
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from tests.helpers.daemon import Daemon, run_cli, scrape
from tests.helpers.snapshots import newest_metadata

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3
    from gateway.storage.s3 import S3Storage

KiB = 1024
NODE = "node-1"
SEGMENTS = ("logs/a", "logs/b")
APPENDS = 6
APPEND_BYTES = 50 * KiB

# Chunks of at most 128 KiB, so each segment has several; no flushes but
# those asked for, and none at stop (the tail stays in the journal).
TIER2 = """
[tier2]
url = "{url}"
{endpoint}
flush_size = "64 KiB"
flush_interval = "1h"
max_chunk_size = "128 KiB"
snapshot_interval = "0s"
stop_flush_timeout = "0s"
gc_interval = "1h"
gc_grace = "1h"
"""


def node_config(data_dir: pathlib.Path, url: str = "", endpoint: str = "") -> str:
    url = url or f"file://{data_dir}/tier2"
    endpoint = f'endpoint_url = "{endpoint}"' if endpoint else ""
    return f'[node]\ndata_dir = "{data_dir}"\n' + TIER2.format(url=url, endpoint=endpoint)


def populate(daemon: Daemon) -> dict[str, bytes]:
    """Two segments in several chunks, their blocks cached; one only in the journal."""
    rng = random.Random(7)
    data = {}
    with SyncClient(daemon.address) as c:
        for name in SEGMENTS:
            c.create(name)
            chunks = [rng.randbytes(APPEND_BYTES) for _ in range(APPENDS)]
            for piece in chunks:
                c.append(name, piece)
            data[name] = b"".join(chunks)
        c.flush()
        for name in SEGMENTS:
            assert c.read(name, 0, len(data[name])).data == data[name]  # fills the cache
            assert c.info(name).chunk_count >= 3
        # Created after the flush, so no flush is due or asked for: its
        # bytes stay in the journal only.
        c.create("tail")
        c.append("tail", b"tail" * 100)
        data["tail"] = b"tail" * 100
    return data


@dataclass
class Run:
    """One fsck run: exit code, findings, summary, output."""

    code: int
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    stdout: str
    stderr: str

    def problems(self, check: str) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["check"] == check and f["severity"] == "problem"]

    def status(self, check: str) -> str:
        return next(c["status"] for c in self.summary["checks"] if c["check"] == check)


def fsck(config: pathlib.Path, *args: str, env: dict[str, str] | None = None) -> Run:
    """``segment-gateway --config CONFIG fsck ARGS --json``."""
    run = parse_run(run_cli("--config", str(config), "fsck", "--json", *args, timeout=120, env=env))
    assert run.summary["exit_code"] == run.code, run
    return run


def parse_run(r: subprocess.CompletedProcess[str]) -> Run:
    """The findings and summary of ``fsck --json`` output."""
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines and "summary" in lines[-1], (r.returncode, r.stdout, r.stderr)
    return Run(r.returncode, lines[:-1], lines[-1]["summary"], r.stdout, r.stderr)


def assert_clean(run: Run) -> None:
    """fsck finds nothing."""
    assert run.code == 0, run
    assert not [f for f in run.findings if f["severity"] == "problem"], run.findings
    assert run.summary["problems"] == 0


@dataclass
class Node:
    """A stopped node's directories and the configuration naming them."""

    data_dir: pathlib.Path
    config: pathlib.Path
    data: dict[str, bytes]

    @property
    def tier2(self) -> FileStorage:
        return FileStorage(self.data_dir / "tier2")

    def chunk_keys(self) -> list[str]:
        return sorted(o.key for o in self.tier2.list(names.chunks_prefix(NODE)))

    def object_path(self, key: str) -> pathlib.Path:
        return self.data_dir / "tier2" / key

    def daemon(self) -> Daemon:
        return Daemon(self.data_dir, self.config.read_text())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, bytes]]:
    """A populated, stopped node, made once per module (a daemon start and stop)."""
    data_dir = tmp_path_factory.mktemp("pristine") / "node"
    daemon = Daemon(data_dir, node_config(data_dir))
    daemon.start()
    try:
        data = populate(daemon)
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()
    return data_dir, data


@pytest.fixture
def node(tmp_path: pathlib.Path, pristine: tuple[pathlib.Path, dict[str, bytes]]) -> Node:
    """A copy of the pristine node, with a configuration of its own."""
    source, data = pristine
    data_dir = tmp_path / "node"
    shutil.copytree(source, data_dir, symlinks=True)
    (data_dir / "daemon.log").unlink(missing_ok=True)
    config = data_dir / "gateway.toml"
    config.write_text(node_config(data_dir))
    return Node(data_dir, config, data)


@pytest.fixture
def running(node: Node) -> Iterator[Daemon]:
    """The node's daemon, running."""
    daemon = node.daemon()
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.kill()


# -- a clean node -------------------------------------------------------------------


def test_clean_node_offline_finds_nothing(node: Node) -> None:
    run = fsck(node.config, "--deep")
    assert_clean(run)
    assert run.summary["mode"] == "offline"
    assert [c["status"] for c in run.summary["checks"]] == ["ok"] * 8
    # Without --deep the data check is skipped, and says so.
    plain = run_cli("--config", str(node.config), "fsck", timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    lines = plain.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:8]] == [
        "check journal",
        "check metadata",
        "check chunks",
        "check chunk-data",
        "check attribute-index",
        "check orphans",
        "check cache",
        "check name-claims",
    ]
    assert lines[0].startswith("check journal: ok (")
    assert lines[1].startswith("check metadata: ok (3 segment(s), ")
    assert lines[3].startswith("check chunk-data: skipped (")
    # The filesystem binding is shared Tier 2 too: the three names are claimed.
    assert lines[7].startswith("check name-claims: ok (3 name claim(s) listed: 3 of names here")
    assert lines[-1] == "fsck (offline): no problems found"


def test_clean_node_online_finds_nothing(node: Node, running: Daemon) -> None:
    # The daemon holds the journal's lock: fsck asks it (at server.listen,
    # here given with --connect) and reads the journal files itself.
    run = fsck(node.config, "--deep", "--connect", running.address)
    assert_clean(run)
    assert run.summary["mode"].startswith("online")
    assert [c["status"] for c in run.summary["checks"]] == ["ok"] * 8
    # Without --connect the lock tells that the daemon runs.
    listen = f'[server]\nlisten = "{running.address}"\n\n[tier2]'
    node.config.write_text(node.config.read_text().replace("[tier2]", listen))
    run = fsck(node.config)
    assert_clean(run)
    assert run.summary["mode"] == f"online, through {running.address}"
    with SyncClient(running.address) as c:  # the daemon is unharmed
        for name, data in node.data.items():
            assert c.read(name, 0, len(data) + 1).data == data


def fsck_without_config(*args: str) -> Run:
    """``segment-gateway fsck --json ARGS`` with no --config (the default file must not exist)."""
    if DEFAULT_CONFIG_PATH.exists():
        pytest.skip(f"{DEFAULT_CONFIG_PATH} exists here: it would name a journal")
    return parse_run(run_cli("fsck", "--json", *args, timeout=120))


def skipped(run: Run, check: str) -> str:
    return str(next(c["skipped"] for c in run.summary["checks"] if c["check"] == check))


def test_online_checks_only_a_journal_it_was_given_and_that_the_daemon_holds(
    node: Node, running: Daemon, pristine: tuple[pathlib.Path, dict[str, bytes]]
) -> None:
    # --connect alone: no journal directory named here, so none is checked.
    run = fsck_without_config("--connect", running.address)
    assert_clean(run)
    assert run.status("journal") == "skipped"
    why = skipped(run, "journal")
    assert "neither --data-dir nor a configuration file" in why and "None" not in why, why
    assert [run.status(c) for c in ("metadata", "chunks", "orphans", "cache")] == ["ok"] * 4
    # --data-dir naming the daemon's directory: its journal is checked.
    run = fsck_without_config("--connect", running.address, "--data-dir", str(node.data_dir))
    assert_clean(run)
    assert run.status("journal") == "ok"
    # A journal no daemon holds is not the connected daemon's: not checked as if it were.
    stopped = pristine[0]
    run = fsck_without_config("--connect", running.address, "--data-dir", str(stopped))
    assert run.status("journal") == "skipped"
    assert f"no running daemon holds {stopped / 'journal'}" in skipped(run, "journal")
    # A directory that is not there is said to be missing (not "None").
    run = fsck_without_config("--connect", running.address, "--data-dir", str(node.data_dir / "x"))
    assert "there is no journal directory" in skipped(run, "journal")


# -- Tier 2 faults ------------------------------------------------------------------


def test_deleted_chunk_object_is_found_online_and_offline(node: Node, running: Daemon) -> None:
    victim = node.chunk_keys()[1]
    node.object_path(victim).unlink()
    run = fsck(node.config, "--connect", running.address)
    assert run.code == 2
    (problem,) = run.problems("chunks")
    assert problem["key"] == victim and "is missing" in problem["message"]
    assert problem["segment"] in SEGMENTS and problem["offset"] is not None
    run = fsck(node.config, "--connect", running.address, "--repair")
    assert run.code == 2 and "stop the daemon" in run.problems("chunks")[0]["action"]
    # What the alerting rules see (SegmentGatewayFsckProblems): left unrepaired.
    m = scrape(running.metrics_port)
    assert m["segment_gateway_fsck_runs_total"] == 2
    assert m['segment_gateway_fsck_problems{check="chunks"}'] == 1
    assert m['segment_gateway_fsck_problems{check="metadata"}'] == 0
    assert running.stop() == 0
    # Offline, the chunk's blocks are all in the cache and match its CRC32C:
    # they are written back.
    run = fsck(node.config, "--repair")
    assert run.code == 1
    (problem,) = run.problems("chunks")
    assert problem["key"] == victim and problem["repaired"]
    assert problem["action"] == "restored from the cache (CRC32C verified)"
    assert_clean(fsck(node.config, "--deep"))


def test_truncated_chunk_object_is_found(node: Node) -> None:
    victim = node.chunk_keys()[0]
    size = node.object_path(victim).stat().st_size
    os.truncate(node.object_path(victim), size - 1000)
    run = fsck(node.config)
    assert run.code == 2
    (problem,) = run.problems("chunks")
    assert problem["key"] == victim
    assert f"has {size - 1000} bytes, its record says {size}" in problem["message"]
    # Without the cache there is no other copy: nothing to repair it from.
    shutil.rmtree(node.data_dir / "cache")
    run = fsck(node.config, "--repair")
    assert run.code == 2
    (problem,) = run.problems("chunks")
    assert not problem["repaired"] and "no copy left" in problem["action"]
    assert run.status("cache") == "skipped"


def test_flipped_byte_is_found_only_with_deep(node: Node) -> None:
    victim = node.chunk_keys()[2]
    path = node.object_path(victim)
    with path.open("r+b") as f:
        f.seek(777)
        byte = f.read(1)
        f.seek(777)
        f.write(bytes([byte[0] ^ 0x01]))
    assert_clean(fsck(node.config))  # sizes are right: only reading tells
    run = fsck(node.config, "--deep")
    assert run.code == 2
    (problem,) = run.problems("chunk-data")
    assert problem["key"] == victim and "CRC32C" in problem["message"]
    assert run.status("chunks") == "ok"
    run = fsck(node.config, "--deep", "--repair")
    assert run.code == 1
    assert run.problems("chunk-data")[0]["action"] == "restored from the cache (CRC32C verified)"
    assert_clean(fsck(node.config, "--deep"))


def test_orphan_objects_old_ones_repaired_young_ones_kept(node: Node) -> None:
    old = f"{NODE}/chunks/1/{0:020d}.e1.{'a' * 32}"
    young = f"{NODE}/chunks/2/{0:020d}.e1.{'b' * 32}"
    node.tier2.write(old, b"x" * 1000, {})
    node.tier2.write(young, b"y" * 10, {})
    two_hours_ago = time.time() - 7200
    os.utime(node.object_path(old), (two_hours_ago, two_hours_ago))
    run = fsck(node.config)
    assert run.code == 2
    assert {p["key"] for p in run.problems("orphans")} == {old, young}
    assert old in {k for k in node.chunk_keys()}  # nothing deleted without --repair

    run = fsck(node.config, "--repair")
    assert run.code == 2  # the young one is kept (tier2.gc_grace = 1h)
    by_key = {p["key"]: p for p in run.problems("orphans")}
    assert by_key[old]["repaired"] and by_key[old]["action"] == "deleted"
    assert not by_key[young]["repaired"]
    assert "younger than tier2.gc_grace" in by_key[young]["action"]
    assert old not in node.chunk_keys() and young in node.chunk_keys()

    node.tier2.delete(young)
    assert_clean(fsck(node.config))


def test_orphan_repaired_by_a_running_daemon(node: Node, running: Daemon) -> None:
    old = f"{NODE}/chunks/1/{0:020d}.e1.{'c' * 32}"
    node.tier2.write(old, b"x" * 100, {})
    # Older than tier2.gc_grace (1h), but the daemon's GC (every hour) may
    # not have passed yet: a note, not a problem.
    os.utime(node.object_path(old), (time.time() - 7200,) * 2)
    run = fsck(node.config, "--connect", running.address)
    assert run.code == 0
    assert [f["key"] for f in run.findings if f["check"] == "orphans"] == [old]
    # Older than GC's two passes with their retries: GC is failing, a problem.
    os.utime(node.object_path(old), (time.time() - 5 * 3600,) * 2)
    run = fsck(node.config, "--connect", running.address)
    assert run.code == 2
    assert [p["key"] for p in run.problems("orphans")] == [old]
    assert scrape(running.metrics_port)['segment_gateway_fsck_problems{check="orphans"}'] == 1
    run = fsck(node.config, "--connect", running.address, "--repair")
    assert run.code == 1
    (problem,) = run.problems("orphans")
    assert problem["key"] == old and problem["repaired"]
    # Repaired: nothing left for the alerting rules.
    m = scrape(running.metrics_port)
    assert m['segment_gateway_fsck_problems{check="orphans"}'] == 0
    assert m["segment_gateway_fsck_runs_total"] == 3
    assert old not in node.chunk_keys()
    assert_clean(fsck(node.config, "--connect", running.address))


# -- journal faults -----------------------------------------------------------------


def frames(path: pathlib.Path) -> list[FrameRecord]:
    with mapped(path) as data:
        return [r for r in read_frames(data, path) if isinstance(r, FrameRecord)]


def test_corrupt_journal_frame_in_the_middle_is_reported_and_left_alone(node: Node) -> None:
    journal = node.data_dir / "journal"
    path = list_files(journal)[-1].path
    records = frames(path)
    assert len(records) >= 4
    victim = records[1]
    with path.open("r+b") as f:
        f.seek(victim.offset + HEADER_SIZE + 2)
        byte = f.read(1)
        f.seek(victim.offset + HEADER_SIZE + 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = path.read_bytes()
    # Tier 2 has lost a chunk too: fsck must still find it.
    lost = node.chunk_keys()[0]
    node.object_path(lost).unlink()

    run = fsck(node.config, "--deep")
    assert run.code == 2
    (problem,) = run.problems("journal")
    assert problem["file"] == str(path) and problem["offset"] == victim.offset
    assert "CRC32C mismatch" in problem["message"]
    # Without the journal's metadata, Tier 2 is checked against the newest
    # metadata snapshot there, and the output says so.
    assert run.status("metadata") == "skipped"
    why = skipped(run, "metadata")
    assert why.startswith("the journal cannot be read"), why
    found = newest_metadata(node.tier2, NODE)
    assert found is not None
    newest = found[0]
    assert f"use the newest metadata snapshot in Tier 2 instead, {newest} (taken " in why, why
    (missing,) = run.problems("chunks")
    assert missing["key"] == lost and "is missing" in missing["message"], missing
    assert missing["segment"] in SEGMENTS and missing["offset"] is not None
    assert [run.status(c) for c in ("chunk-data", "orphans")] == ["ok", "ok"]
    assert f"per snapshot {newest}" in next(
        c["detail"] for c in run.summary["checks"] if c["check"] == "orphans"
    )
    assert run.status("cache") == "skipped"
    plain = run_cli("--config", str(node.config), "fsck", timeout=120)
    lines = plain.stdout.splitlines()
    metadata = next(line for line in lines if line.startswith("check metadata:"))
    assert metadata.startswith("check metadata: skipped (the journal cannot be read"), metadata
    assert "check chunks: 1 problem(s)" in lines, lines

    # --repair changes neither the journal nor Tier 2 on a snapshot's word
    # (the cache holds the lost chunk, and would restore it otherwise).
    run = fsck(node.config, "--repair")
    assert run.code == 2
    (problem,) = run.problems("journal")
    assert "no safe repair" in problem["action"] and not problem["repaired"]
    (missing,) = run.problems("chunks")
    assert not missing["repaired"] and "snapshot" in missing["action"], missing
    assert path.read_bytes() == before
    assert not node.object_path(lost).exists()

    # No snapshot to fall back on: the rest is skipped, and says why.
    for obj in node.tier2.list(names.meta_prefix(NODE)):
        node.tier2.delete(obj.key)
    run = fsck(node.config)
    assert run.code == 2
    assert "holds no readable metadata snapshot" in skipped(run, "metadata")
    assert [run.status(c) for c in ("chunks", "orphans", "cache")] == ["skipped"] * 3


def test_torn_journal_tail_is_cut_by_repair(node: Node) -> None:
    path = list_files(node.data_dir / "journal")[-1].path
    last = frames(path)[-1]
    os.truncate(path, last.offset + HEADER_SIZE + last.header.payload_length // 2)
    run = fsck(node.config)
    assert run.code == 2
    (problem,) = run.problems("journal")
    assert problem["offset"] == last.offset and "torn write" in problem["message"]
    run = fsck(node.config, "--repair")
    assert run.code == 1
    assert run.problems("journal")[0]["action"] == "cut off"
    assert_clean(fsck(node.config))


# -- cache faults -------------------------------------------------------------------


def test_cache_entries_that_disagree_are_dropped(node: Node) -> None:
    chunks = node.chunk_keys()
    store = CacheStore.open(node.data_dir / "cache", 64 * 1024 * 1024)
    try:
        cached = {chunk for chunk, _, _ in store.blocks()}
        assert set(chunks) <= cached
        gone = f"{NODE}/chunks/9/{0:020d}.e1.{'d' * 32}"
        store.put_block(gone, 0, b"z" * 100)  # a chunk nobody names
        store.put_block(chunks[0], 7, b"z" * 100)  # past the chunk's end
        size = len(store.get_block(chunks[1], 0) or b"")
        store.put_block(chunks[1], 0, b"\x00" * size)  # right size, wrong bytes
    finally:
        store.close()

    run = fsck(node.config)
    assert run.code == 2
    assert {p["key"] for p in run.problems("cache")} == {gone, chunks[0]}
    run = fsck(node.config, "--deep")
    assert {p["key"] for p in run.problems("cache")} == {gone, chunks[0], chunks[1]}
    assert "differs from the chunk in Tier 2" in next(
        p["message"] for p in run.problems("cache") if p["key"] == chunks[1]
    )
    run = fsck(node.config, "--deep", "--repair")
    assert run.code == 1
    assert all(p["repaired"] for p in run.problems("cache"))
    assert_clean(fsck(node.config, "--deep"))
    # The segments read back right (their blocks come from Tier 2 again).
    daemon = node.daemon()
    daemon.start()
    try:
        with SyncClient(daemon.address) as c:
            for name, data in node.data.items():
                assert c.read(name, 0, len(data)).data == data
    finally:
        daemon.kill()


# -- metadata invariants ------------------------------------------------------------


def chunk(start: int, length: int, name: str = "") -> ChunkRecord:
    return ChunkRecord(name=name or f"c{start}", start_offset=start, length=length)


def test_metadata_invariants_name_every_violation() -> None:
    good = SegmentRecord(
        name="s", start_offset=50, length=400, storage_length=300,
        chunks=[chunk(0, 100), chunk(100, 200)], event_index=[50, 200],
    )  # fmt: skip
    assert list(segment_problems(good)) == []
    bad = SegmentRecord(
        name="s", start_offset=50, length=400, storage_length=350, sealed_in_storage=True,
        chunks=[chunk(60, 100), chunk(150, 100), chunk(260, 50)], event_index=[10],
    )  # fmt: skip
    messages = [m for m, _ in segment_problems(bad)]
    assert any("marked sealed in storage, but it is not sealed" in m for m in messages)
    assert any("no chunk holds [50, 60)" in m for m in messages)
    assert any("overlap at [150, 160)" in m for m in messages)
    assert any("no chunk holds [250, 260)" in m for m in messages)
    assert any("chunks end at 310, the storage length is 350" in m for m in messages)
    assert any("event index" in m for m in messages)
    inverted = SegmentRecord(name="s", start_offset=10, length=5, storage_length=10)
    assert any("out of order" in m for m, _ in segment_problems(inverted))


# -- the real S3 server --------------------------------------------------------------


def test_fsck_over_s3(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage) -> None:
    data_dir = tmp_path / "node"
    config_text = node_config(
        data_dir, url=f"s3://{s3_storage.bucket}/p", endpoint=seaweedfs.endpoint_url
    ).replace('gc_grace = "1h"', 'gc_grace = "0s"')
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    daemon = Daemon(data_dir, config_text, env=env)
    daemon.start()
    try:
        populate(daemon)
        assert_clean(fsck(daemon.config_path, "--deep", "--connect", daemon.address, env=env))
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()
    keys = sorted(o.key for o in s3_storage.list(f"p/{NODE}/chunks/"))
    s3_storage.delete(keys[0])
    orphan = f"p/{NODE}/chunks/5/{0:020d}.e1.{'e' * 32}"
    s3_storage.write(orphan, b"garbage", {})
    run = fsck(daemon.config_path, env=env)
    assert run.code == 2
    (missing,) = run.problems("chunks")
    assert missing["key"] == keys[0].removeprefix("p/")
    (found,) = run.problems("orphans")
    assert found["key"] == orphan.removeprefix("p/") and not found["repaired"]
    # tier2.gc_grace is 0 here: the orphan goes; the chunk comes back from the cache.
    run = fsck(daemon.config_path, "--repair", env=env)
    assert run.code == 1
    assert all(p["repaired"] for p in run.findings if p["severity"] == "problem")
    assert {o.key for o in s3_storage.list(f"p/{NODE}/chunks/")} == set(keys)
    assert_clean(fsck(daemon.config_path, "--deep", env=env))


def test_no_journal_directory_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(node_config(tmp_path / "nothing"))
    r = run_cli("--config", str(config), "fsck")
    assert r.returncode == 2
    assert f"no journal directory {tmp_path / 'nothing' / 'journal'}" in r.stderr
    assert not (tmp_path / "nothing").exists()  # fsck creates nothing
