"""Tier-2 bindings: one conformance suite for every `ChunkStorage`, then binding specifics.

The ``storage`` fixture runs each conformance test against the in-memory
binding, the filesystem binding (on tmp_path) and the S3 binding (the
``s3_storage`` fixture: a fresh bucket on a real SeaweedFS on loopback).
Behaviour that differs by design is asked of the binding's flags
(``supports_append``, ``supports_concat``), never of its name, except for
S3's 5 MiB minimum size of every multipart part but the last.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.errors import BindingUnsupported, ChunkCorrupt, ChunkNotFound, Tier2Error
from gateway.storage import filesystem
from gateway.storage.filesystem import META_DIR, TEMP_PREFIX, FileStorage
from gateway.storage.interface import ChunkStorage, ObjectInfo
from gateway.storage.memory_storage import MemoryStorage, TemporaryFailure

from .conftest import ROOT

MiB = 1024 * 1024

META = {"segment": "seg/one", "offset": "1024", "crc32c": "0badf00d", "format-version": "1"}


def blob(seed: int, size: int) -> bytes:
    """Deterministic bytes, different per seed."""
    return random.Random(seed).randbytes(size)


def keys_of(infos: Iterator[ObjectInfo]) -> list[str]:
    return [info.key for info in infos]


@pytest.fixture(params=["memory", "file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[ChunkStorage]:
    """Each binding in turn, empty."""
    if request.param == "s3":
        # Owned (and cleaned up) by the fixture in conftest.py.
        yield request.getfixturevalue("s3_storage")
        return
    s: ChunkStorage
    s = MemoryStorage() if request.param == "memory" else FileStorage(tmp_path / "tier2")
    yield s
    s.close()


def min_part(storage: ChunkStorage) -> int:
    """Smallest size of a concat source that is not the last one."""
    return 5 * MiB if storage.kind == "s3" else 0


# -- conformance: every binding -------------------------------------------------


def test_is_a_chunk_storage(storage: ChunkStorage, request: pytest.FixtureRequest) -> None:
    assert isinstance(storage, ChunkStorage)
    assert storage.kind == request.node.callspec.params["storage"]


def test_write_then_read_whole_and_ranges(storage: ChunkStorage) -> None:
    data = blob(1, 10_000)
    storage.write("n/chunks/1/a", data, META)
    whole = storage.read("n/chunks/1/a", 0, len(data))
    assert isinstance(whole, bytes)
    assert whole == data
    assert storage.read("n/chunks/1/a", 0, 100) == data[:100]  # start
    assert storage.read("n/chunks/1/a", 4321, 1234) == data[4321:5555]  # middle
    assert storage.read("n/chunks/1/a", 9_000, 1_000) == data[9_000:]  # exactly to the end
    assert storage.read("n/chunks/1/a", 9_990, 100) == data[9_990:]  # past the end: shorter
    assert storage.read("n/chunks/1/a", 0, 1_000_000) == data
    assert storage.read("n/chunks/1/a", 10_000, 10) == b""  # at the end
    assert storage.read("n/chunks/1/a", 50_000, 10) == b""  # after the end
    assert storage.read("n/chunks/1/a", 10, 0) == b""


def test_zero_length_object(storage: ChunkStorage) -> None:
    storage.write("z/empty", b"", {})
    assert storage.read("z/empty", 0, 100) == b""
    info = storage.stat("z/empty")
    assert (info.key, info.size, dict(info.metadata)) == ("z/empty", 0, {})
    assert [(i.key, i.size) for i in storage.list("z/")] == [("z/empty", 0)]


def test_overwrite_replaces_data_and_metadata(storage: ChunkStorage) -> None:
    storage.write("k", blob(1, 5000), {"v": "1"})
    storage.write("k", b"short", {"v": "2"})
    assert storage.read("k", 0, 10_000) == b"short"
    info = storage.stat("k")
    assert info.size == 5
    assert dict(info.metadata) == {"v": "2"}
    assert keys_of(storage.list("")) == ["k"]


def test_stat_returns_size_mtime_and_metadata(storage: ChunkStorage) -> None:
    before = time.time()
    storage.write("m/with", b"12345", META)
    storage.write("m/without", b"", {})
    info = storage.stat("m/with")
    assert (info.key, info.size, dict(info.metadata)) == ("m/with", 5, META)
    # S3 keeps whole seconds; allow clock granularity on both sides.
    assert before - 2 <= info.mtime <= time.time() + 2
    assert dict(storage.stat("m/without").metadata) == {}


def test_missing_object(storage: ChunkStorage) -> None:
    storage.write("there/a", b"x", {})
    for key in ("there/b", "nowhere/a", "there"):
        with pytest.raises(ChunkNotFound) as e:
            storage.read(key, 0, 1)
        assert isinstance(e.value, Tier2Error)
        assert not storage.is_temp_failure(e.value)
        with pytest.raises(ChunkNotFound):
            storage.stat(key)
    assert not storage.is_temp_failure(ValueError("no"))


def test_list_is_in_key_order_and_matches_string_prefixes(storage: ChunkStorage) -> None:
    # "-" < "/" < "0": a walk that sorts directory names as they are would
    # put "p/x/..." before "p/x-1".
    keys = ["p/x0", "p/x/2/deep/k", "pz", "p/x-1", "q/1", "p/y/z/w/1", "p/x/1"]
    for i, key in enumerate(keys):
        storage.write(key, blob(i, i + 1), {"i": str(i)})
    assert keys_of(storage.list("")) == sorted(keys)
    assert keys_of(storage.list("p")) == sorted(k for k in keys if k.startswith("p"))
    assert keys_of(storage.list("p/x")) == ["p/x-1", "p/x/1", "p/x/2/deep/k", "p/x0"]
    assert keys_of(storage.list("p/x/")) == ["p/x/1", "p/x/2/deep/k"]
    assert keys_of(storage.list("p/x-")) == ["p/x-1"]
    assert keys_of(storage.list("p/x/2/de")) == ["p/x/2/deep/k"]
    assert keys_of(storage.list("p/y/z/w/")) == ["p/y/z/w/1"]
    assert keys_of(storage.list("p/y/z/w/1")) == ["p/y/z/w/1"]
    assert keys_of(storage.list("p/y/z/w/10")) == []
    assert keys_of(storage.list("nothing")) == []
    assert keys_of(storage.list("q/1/")) == []
    sizes = {info.key: info.size for info in storage.list("")}
    assert sizes == {key: i + 1 for i, key in enumerate(keys)}


def test_delete_is_idempotent_and_final(storage: ChunkStorage) -> None:
    storage.write("d/a/1", b"one", META)
    storage.write("d/a/2", b"two", {})
    storage.delete("d/a/1")
    storage.delete("d/a/1")
    storage.delete("never/written")
    with pytest.raises(ChunkNotFound):
        storage.stat("d/a/1")
    with pytest.raises(ChunkNotFound):
        storage.read("d/a/1", 0, 10)
    assert keys_of(storage.list("")) == ["d/a/2"]
    assert storage.read("d/a/2", 0, 10) == b"two"
    storage.delete("d/a/2")
    assert keys_of(storage.list("")) == []
    # The key is free again, metadata included.
    storage.write("d/a/1", b"new", {})
    assert storage.read("d/a/1", 0, 10) == b"new"
    assert dict(storage.stat("d/a/1").metadata) == {}


def test_append(storage: ChunkStorage) -> None:
    storage.write("ap/k", b"abc", {"n": "1"})
    if not storage.supports_append:
        with pytest.raises(BindingUnsupported) as e:
            storage.append("ap/k", 3, b"def", {"n": "2"})
        assert not storage.is_temp_failure(e.value)
        assert storage.read("ap/k", 0, 100) == b"abc"
        return
    storage.append("ap/k", 3, b"def", {"n": "2"})
    assert storage.read("ap/k", 0, 100) == b"abcdef"
    info = storage.stat("ap/k")
    assert (info.size, dict(info.metadata)) == (6, {"n": "2"})
    # A retry at the earlier offset replaces what the first attempt left.
    storage.append("ap/k", 3, b"DEFG", {"n": "3"})
    assert storage.read("ap/k", 0, 100) == b"abcDEFG"
    storage.append("ap/k", 3, b"d", {"n": "4"})
    assert storage.read("ap/k", 0, 100) == b"abcd"
    assert dict(storage.stat("ap/k").metadata) == {"n": "4"}
    # Past the end would leave a hole: refused, nothing changes.
    with pytest.raises(Tier2Error) as refused:
        storage.append("ap/k", 10, b"x", {})
    assert not isinstance(refused.value, ChunkNotFound)
    assert storage.read("ap/k", 0, 100) == b"abcd"
    with pytest.raises(ChunkNotFound):
        storage.append("ap/missing", 0, b"x", {})
    assert keys_of(storage.list("ap/")) == ["ap/k"]
    storage.write("ap/empty", b"", {})
    storage.append("ap/empty", 0, bytearray(b"first"), {})
    storage.append("ap/empty", 5, memoryview(b"--second--")[2:8], {})
    assert storage.read("ap/empty", 0, 100) == b"firstsecond"


def test_concat(storage: ChunkStorage) -> None:
    big = min_part(storage)
    parts = [blob(1, big + 1000), blob(2, big + 3000), blob(3, 777)]
    if not big:
        parts.insert(1, b"")  # an empty source is fine where parts have no minimum
    sources = [f"c/src/{i}" for i in range(len(parts))]
    for key, data in zip(sources, parts, strict=True):
        storage.write(key, data, {"part": key})
    if not storage.supports_concat:
        with pytest.raises(BindingUnsupported):
            storage.concat("c/joined", sources, META)
        assert keys_of(storage.list("c/joined")) == []
        return
    storage.concat("c/joined", sources, META)
    joined = b"".join(parts)
    assert storage.read("c/joined", 0, len(joined) + 10) == joined
    info = storage.stat("c/joined")
    assert (info.size, dict(info.metadata)) == (len(joined), META)
    for key, data in zip(sources, parts, strict=True):  # the sources stay
        assert storage.read(key, 0, len(data) + 1) == data
    # A target that is also a source (merging into the first chunk).
    storage.concat(sources[0], [sources[0], sources[-1]], {"merged": "yes"})
    assert storage.read(sources[0], 0, len(joined)) == parts[0] + parts[-1]
    with pytest.raises(ChunkNotFound):
        storage.concat("c/never", [sources[0], "c/src/missing"], {})
    assert keys_of(storage.list("c/never")) == []


def test_thousand_keys(storage: ChunkStorage) -> None:
    keys = [f"many/{i % 7}/{i:04d}.e1" for i in range(1000)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: storage.write(k, k.encode(), {}), keys))
    listed = list(storage.list("many/"))
    assert [i.key for i in listed] == sorted(keys)
    assert all(i.size == len(i.key) for i in listed)
    assert keys_of(storage.list("many/3/")) == sorted(k for k in keys if k.startswith("many/3/"))
    assert keys_of(storage.list("many/3/09")) == [
        f"many/3/09{n:02d}.e1" for n in range(100) if (900 + n) % 7 == 3
    ]


def test_threads_on_different_keys(storage: ChunkStorage) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(15):
                key = f"t/{t}/{i}"
                data = blob(t * 100 + i, 1000 + i * 37)
                storage.write(key, data, {"t": str(t)})
                assert storage.read(key, 0, len(data)) == data
                assert storage.read(key, 500, 100) == data[500:600]
                assert storage.stat(key).size == len(data)
                if i % 3 == 0:
                    storage.delete(key)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    expected = sorted(f"t/{t}/{i}" for t in range(8) for i in range(15) if i % 3)
    assert keys_of(storage.list("t/")) == expected


def test_buffer_types(storage: ChunkStorage) -> None:
    mutable = bytearray(b"from a bytearray")
    storage.write("b/bytes", b"from bytes", {})
    storage.write("b/bytearray", mutable, {})
    mutable[:4] = b"XXXX"  # the store must have copied it
    backing = b"....from a memoryview slice...."
    storage.write("b/memoryview", memoryview(backing)[4:-4], {})
    assert storage.read("b/bytes", 0, 100) == b"from bytes"
    assert storage.read("b/bytearray", 0, 100) == b"from a bytearray"
    assert storage.read("b/memoryview", 0, 100) == b"from a memoryview slice"
    assert storage.stat("b/memoryview").size == len(b"from a memoryview slice")


# -- the filesystem binding ------------------------------------------------------


@pytest.fixture
def fs(tmp_path: pathlib.Path) -> FileStorage:
    return FileStorage(tmp_path / "tier2")


def files_under(root: pathlib.Path) -> list[str]:
    """Every file below ``root``, as relative paths."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_file_layout_is_plain_bytes_plus_json_sidecar(fs: FileStorage) -> None:
    fs.write("n/chunks/7/0001", b"segment bytes", META)
    assert (fs.root / "n/chunks/7/0001").read_bytes() == b"segment bytes"
    sidecar = json.loads((fs.root / META_DIR / "n/chunks/7/0001").read_text())
    assert sidecar == {"version": 1, "metadata": META}
    assert files_under(fs.root) == [f"{META_DIR}/n/chunks/7/0001", "n/chunks/7/0001"]


def test_file_sidecars_never_listed(fs: FileStorage) -> None:
    fs.write("a/b", b"x", META)
    fs.write("x/.meta/y", b"y", {"k": "v"})  # only the top-level name is reserved
    assert keys_of(fs.list("")) == ["a/b", "x/.meta/y"]
    for prefix in (".", ".m", ".meta", ".meta/", ".meta/a", ".meta/a/b"):
        assert keys_of(fs.list(prefix)) == [], prefix
    assert keys_of(fs.list("x/.m")) == ["x/.meta/y"]
    assert dict(fs.stat("x/.meta/y").metadata) == {"k": "v"}


@pytest.mark.parametrize(
    "key", ["../x", "a/../b", "a/..", "/abs", "a//b", "a/./b", ".", "a/", "", ".meta", ".meta/x",
            f"a/{TEMP_PREFIX}1", "a\0b"]
)  # fmt: skip
def test_file_rejects_bad_keys(fs: FileStorage, key: str) -> None:
    fs.write("ok", b"1", {})
    calls: list[Callable[[], object]] = [
        lambda: fs.write(key, b"x", {}),
        lambda: fs.read(key, 0, 1),
        lambda: fs.stat(key),
        lambda: fs.delete(key),
        lambda: fs.append(key, 0, b"x", {}),
        lambda: fs.concat(key, ["ok"], {}),
        lambda: fs.concat("ok2", ["ok", key], {}),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert files_under(fs.root.parent) == ["tier2/.meta/ok", "tier2/ok"]


def test_file_key_and_keys_below_it_conflict(fs: FileStorage) -> None:
    fs.write("a", b"file", {})
    with pytest.raises(Tier2Error, match="cannot store 'a/b'"):
        fs.write("a/b", b"x", {})
    fs.write("d/e", b"below", {})
    with pytest.raises(Tier2Error, match="cannot store 'd'"):
        fs.write("d", b"x", {})
    for call in (
        lambda: fs.stat("d"),
        lambda: fs.read("d", 0, 1),
        lambda: fs.append("d", 0, b"", {}),
    ):
        with pytest.raises(ChunkNotFound):
            call()
    fs.delete("d")  # nothing there: a no-op that keeps d/e
    assert keys_of(fs.list("")) == ["a", "d/e"]
    assert fs.read("a", 0, 10) == b"file"


def test_file_delete_removes_empty_directories_but_not_the_root(fs: FileStorage) -> None:
    fs.write("a/b/c", b"1", META)
    fs.write("a/d", b"2", META)
    fs.delete("a/b/c")
    assert not (fs.root / "a/b").exists()
    assert not (fs.root / META_DIR / "a/b").exists()
    assert (fs.root / "a").is_dir()
    fs.delete("a/d")
    assert sorted(os.listdir(fs.root)) == [META_DIR]
    assert os.listdir(fs.root / META_DIR) == []
    fs.write("top", b"", {})
    fs.delete("top")
    assert sorted(os.listdir(fs.root)) == [META_DIR]


def test_file_write_leaves_no_temporary_files(fs: FileStorage) -> None:
    for i in range(20):
        fs.write(f"w/{i % 3}/{i}", blob(i, 100 * i), {"i": str(i)})
    fs.append("w/0/0", 0, b"appended", {})
    fs.concat("w/joined", ["w/0/3", "w/1/4"], {})
    assert not [p for p in files_under(fs.root) if TEMP_PREFIX in p]


# Run in a child process: crash (SIGKILL) right where write() is about to
# rename the complete, fsynced temporary file onto the object.
_CRASH_IN_WRITE = """
import os, pathlib, signal, sys
from gateway.storage.filesystem import FileStorage
s = FileStorage(pathlib.Path(sys.argv[1]))
os.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
s.write("seg/chunk", b"NEW" * 1000, {"v": "new"})
"""


def test_file_crash_during_write_keeps_old_object_and_hides_temp_file(fs: FileStorage) -> None:
    fs.write("seg/chunk", b"old", {"v": "old"})
    r = subprocess.run(
        [sys.executable, "-c", _CRASH_IN_WRITE, str(fs.root)], cwd=ROOT, capture_output=True
    )
    assert r.returncode == -9, r.stderr
    leftovers = [p for p in files_under(fs.root) if TEMP_PREFIX in p]
    assert len(leftovers) == 1 and leftovers[0].startswith("seg/")
    assert (fs.root / leftovers[0]).read_bytes() == b"NEW" * 1000
    # The crash left the old object whole, and the temp file is invisible.
    assert keys_of(fs.list("")) == ["seg/chunk"]
    assert keys_of(fs.list("seg/.t")) == []
    assert fs.read("seg/chunk", 0, 100) == b"old"
    assert dict(fs.stat("seg/chunk").metadata) == {"v": "old"}
    assert fs.remove_temp_files() == 0  # too young: may be a write in progress
    assert fs.remove_temp_files(min_age=0) == 1
    assert files_under(fs.root) == [f"{META_DIR}/seg/chunk", "seg/chunk"]


def test_file_failed_write_keeps_old_object(
    fs: FileStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.write("k", b"old", {"v": "old"})

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError) as e:
        fs.write("k", b"new", {"v": "new"})
    monkeypatch.undo()
    assert e.value.errno == errno.EIO
    assert not fs.is_temp_failure(e.value)  # a failing disk is not waited out
    assert FileStorage(fs.root, eio_is_temporary=True).is_temp_failure(e.value)
    assert fs.read("k", 0, 10) == b"old"
    assert dict(fs.stat("k").metadata) == {"v": "old"}
    assert files_under(fs.root) == [f"{META_DIR}/k", "k"]


@pytest.mark.parametrize(
    ("err", "temporary"),
    [
        (errno.EAGAIN, True),
        (errno.EBUSY, True),
        (errno.ETIMEDOUT, True),
        (errno.ESTALE, True),
        (errno.EINTR, True),
        (errno.EIO, False),
        (errno.ENOSPC, False),
        (errno.EACCES, False),
        (errno.ENOENT, False),
    ],
)
def test_file_temporary_failures(fs: FileStorage, err: int, temporary: bool) -> None:
    assert fs.is_temp_failure(OSError(err, os.strerror(err))) is temporary


def test_file_append_after_a_partial_append(fs: FileStorage) -> None:
    fs.write("k", b"abc", {})
    with open(fs.root / "k", "ab") as f:  # a crashed append got this far
        f.write(b"dXXXXXXXXXXXX")
    fs.append("k", 3, b"def", {"done": "1"})
    assert fs.read("k", 0, 100) == b"abcdef"
    with pytest.raises(Tier2Error, match="has only 6 bytes"):
        fs.append("k", 7, b"x", {})


def test_file_concat_without_copy_file_range(
    fs: FileStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    parts = [blob(1, 3 * MiB // 2), blob(2, 10), blob(3, 9 * MiB)]  # more than one copy block
    for i, data in enumerate(parts):
        fs.write(f"s/{i}", data, {})
    monkeypatch.setattr(os, "copy_file_range", unsupported)
    fs.concat("joined", ["s/0", "s/1", "s/2"], {})
    monkeypatch.delattr(os, "copy_file_range")
    fs.concat("joined2", ["s/2", "s/0"], {})
    monkeypatch.undo()
    assert fs.read("joined", 0, 20 * MiB) == b"".join(parts)
    assert fs.read("joined2", 0, 20 * MiB) == parts[2] + parts[0]


def test_file_corrupt_sidecar(fs: FileStorage) -> None:
    fs.write("k", b"x", {"a": "b"})
    (fs.root / META_DIR / "k").write_text("{not json")
    with pytest.raises(ChunkCorrupt, match="'k'"):
        fs.stat("k")
    (fs.root / META_DIR / "k").unlink()  # a missing sidecar is just no metadata
    assert dict(fs.stat("k").metadata) == {}


def test_file_writes_and_deletes_racing_on_one_directory(fs: FileStorage) -> None:
    # A delete removes directories it leaves empty while other threads are
    # creating files in them: the writers must not notice.
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(150):
                fs.write(f"race/d/{t}", b"%d" % i, {"i": str(i)})
                assert fs.read(f"race/d/{t}", 0, 10) == b"%d" % i
                fs.delete(f"race/d/{t}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert keys_of(fs.list("")) == []
    assert sorted(os.listdir(fs.root)) == [META_DIR]


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("file:///var/lib/t2", "/var/lib/t2"),
        ("file://localhost/var/lib/t2/", "/var/lib/t2"),
        ("file:///srv/with%20space", "/srv/with space"),
    ],
)
def test_file_from_url(url: str, root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[pathlib.Path] = []
    monkeypatch.setattr(FileStorage, "_make_dirs", lambda self, d: made.append(d))
    s = FileStorage.from_url(url)
    assert s.root == pathlib.Path(root)
    assert made == [pathlib.Path(root) / META_DIR]


@pytest.mark.parametrize(
    "url", ["file://host/x", "file:relative", "file:///", "s3://bucket/x", "file:///x?y=1"]
)
def test_file_from_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        FileStorage.from_url(url)


def test_file_read_of_a_large_object(fs: FileStorage) -> None:
    data = blob(9, 16 * MiB + 5)
    fs.write("big", memoryview(data), {})
    assert fs.read("big", 0, len(data)) == data
    assert fs.read("big", 16 * MiB, MiB) == data[16 * MiB :]


def test_file_validate_key_returns_components() -> None:
    assert filesystem.validate_key("a/b.c/..d/e f") == ["a", "b.c", "..d", "e f"]


# -- the in-memory binding's fault injection ------------------------------------


def test_memory_fail_next_defaults_to_temporary_failures() -> None:
    s = MemoryStorage()
    s.fail_next(2)
    for _ in range(2):
        with pytest.raises(TemporaryFailure) as e:
            s.write("k", b"x", {})
        assert s.is_temp_failure(e.value)
    assert keys_of(s.list("")) == []
    s.write("k", b"x", {})
    assert s.read("k", 0, 1) == b"x"
    assert s.calls["write"] == 3
    assert s.calls["list"] == 1
    assert s.calls["read"] == 1


def test_memory_fail_next_only_named_operations() -> None:
    s = MemoryStorage()
    s.write("k", b"abc", {})
    s.fail_next(1, ops={"write", "append"})
    assert s.read("k", 0, 3) == b"abc"
    assert s.stat("k").size == 3
    with pytest.raises(TemporaryFailure):
        s.append("k", 3, b"d", {})
    assert s.read("k", 0, 10) == b"abc"
    s.append("k", 3, b"d", {})
    assert s.read("k", 0, 10) == b"abcd"
    with pytest.raises(ValueError, match="unknown operations"):
        s.fail_next(1, ops={"wirte"})


def test_memory_fail_next_with_a_given_exception_is_final() -> None:
    s = MemoryStorage()
    boom = OSError(errno.EACCES, "denied")
    s.fail_next(2, boom, {"read"})
    s.write("k", b"x", {})
    for _ in range(2):
        with pytest.raises(OSError) as e:
            s.read("k", 0, 1)
        assert e.value is boom
        assert not s.is_temp_failure(e.value)
    assert s.read("k", 0, 1) == b"x"


def test_memory_fail_after_the_operation_took_effect() -> None:
    s = MemoryStorage()
    s.fail_next(1, ops={"write"}, after=True)
    with pytest.raises(TemporaryFailure):
        s.write("k", b"written anyway", {"a": "1"})
    assert s.read("k", 0, 100) == b"written anyway"
    assert dict(s.stat("k").metadata) == {"a": "1"}


def test_memory_faults_queue_in_order() -> None:
    s = MemoryStorage()
    first, second = RuntimeError("first"), RuntimeError("second")
    s.fail_next(1, first)
    s.fail_next(1, second)
    for expected in (first, second):
        with pytest.raises(RuntimeError) as e:
            s.stat("k")
        assert e.value is expected
    with pytest.raises(ChunkNotFound):
        s.stat("k")


def test_memory_down_fails_everything_until_up() -> None:
    s = MemoryStorage()
    s.write("k", b"x", {})
    s.set_down(True)
    calls: list[Callable[[], object]] = [
        lambda: s.write("k", b"y", {}),
        lambda: s.read("k", 0, 1),
        lambda: s.stat("k"),
        lambda: s.list(""),
        lambda: s.delete("k"),
        lambda: s.append("k", 1, b"z", {}),
        lambda: s.concat("j", ["k"], {}),
    ]
    for call in calls:
        with pytest.raises(TemporaryFailure) as e:
            call()
        assert s.is_temp_failure(e.value)
    s.set_down(False)
    assert s.read("k", 0, 10) == b"x"
    assert keys_of(s.list("")) == ["k"]
    assert s.calls == {
        "write": 2, "read": 2, "stat": 1, "list": 2, "delete": 1, "append": 1, "concat": 1
    }  # fmt: skip


def test_memory_without_append_and_concat() -> None:
    s = MemoryStorage(supports_append=False, supports_concat=False)
    assert not s.supports_append and not s.supports_concat
    s.write("k", b"x", {})
    with pytest.raises(BindingUnsupported, match="memory binding does not support append"):
        s.append("k", 1, b"y", {})
    with pytest.raises(BindingUnsupported, match="does not support concat") as e:
        s.concat("j", ["k"], {})
    assert not s.is_temp_failure(e.value)
    assert keys_of(s.list("")) == ["k"]


def test_memory_fault_count_is_exact_under_threads() -> None:
    s = MemoryStorage()
    s.fail_next(100, ops={"write"})
    failures = 0
    lock = threading.Lock()

    def worker(t: int) -> None:
        nonlocal failures
        for i in range(50):
            try:
                s.write(f"{t}/{i}", b"x", {})
            except TemporaryFailure:
                with lock:
                    failures += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == 100
    assert s.calls["write"] == 400
    assert len(list(s.list(""))) == 300
