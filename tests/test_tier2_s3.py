"""The S3 binding against a real SeaweedFS (the session's embedded server).

The behaviour every binding shares is in tests/test_tier2_storage.py; here are
the S3 specifics: ranged reads at and past the end, user metadata, listing
order, multipart concat around its 5 MiB minimum, prefixes, and which errors
count as temporary.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import botocore.exceptions
import pytest
import urllib3.exceptions
from botocore.exceptions import ClientError

from gateway.embedded import EmbeddedS3
from gateway.errors import BindingUnsupported, ChunkNotFound, Tier2Error
from gateway.storage.interface import ChunkStorage
from gateway.storage.s3 import (
    MAX_PART_SIZE,
    MIN_PART_SIZE,
    S3Storage,
    is_temp_failure,
    plan_concat,
    retry_after,
)

META = {"segment": "streams/one", "offset": "4096", "crc32c": "1c291ca3", "epoch": "3"}


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def uploads_in_progress(storage: S3Storage) -> list[Any]:
    answer = storage.client.list_multipart_uploads(Bucket=storage.bucket)
    return list(answer.get("Uploads", []))


def test_is_a_chunk_storage(s3_storage: S3Storage) -> None:
    assert isinstance(s3_storage, ChunkStorage)
    assert (s3_storage.kind, s3_storage.supports_append, s3_storage.supports_concat) == (
        "s3",
        False,
        True,
    )


def test_ranged_reads(s3_storage: S3Storage) -> None:
    data = blob(1, 3 * 1024 * 1024 + 17)
    s3_storage.write("r/k", data, META)
    size = len(data)
    assert s3_storage.read("r/k", 0, size) == data
    assert s3_storage.read("r/k", 1024 * 1024, 1024 * 1024) == data[1024 * 1024 : 2 * 1024 * 1024]
    assert s3_storage.read("r/k", size - 10, 100) == data[-10:]  # shorter only at the end
    assert s3_storage.read("r/k", size - 1, 1) == data[-1:]
    assert s3_storage.read("r/k", size, 10) == b""  # at the end: S3 says 416
    assert s3_storage.read("r/k", size + 5000, 10) == b""
    assert s3_storage.read("r/k", 7, 0) == b""
    with pytest.raises(ValueError):
        s3_storage.read("r/k", -1, 10)


def test_empty_object(s3_storage: S3Storage) -> None:
    s3_storage.write("e", b"", {})
    assert s3_storage.read("e", 0, 100) == b""  # S3 says 416 for any range of it
    assert s3_storage.stat("e").size == 0


def test_buffer_types_are_stored_byte_exact(s3_storage: S3Storage) -> None:
    backing = bytearray(blob(2, 100_000))
    s3_storage.write("b/bytearray", backing, {})
    s3_storage.write("b/view", memoryview(backing)[1000:-1000], {})
    words = memoryview(bytes(backing[:4000])).cast("I")  # not a byte format
    s3_storage.write("b/words", words, {})
    assert s3_storage.read("b/bytearray", 0, 200_000) == backing
    assert s3_storage.read("b/view", 0, 200_000) == backing[1000:-1000]
    assert s3_storage.read("b/view", 500, 10) == backing[1500:1510]
    assert s3_storage.read("b/words", 0, 10_000) == backing[:4000]


def test_stat_returns_metadata_with_lowercase_names(s3_storage: S3Storage) -> None:
    before = datetime.now(UTC).timestamp()
    s3_storage.write("m/k", b"12345", {**META, "Mixed-Case": "Value"})
    info = s3_storage.stat("m/k")
    assert (info.key, info.size) == ("m/k", 5)
    # S3 keeps names in lower case and values as they are.
    assert dict(info.metadata) == {**META, "mixed-case": "Value"}
    assert before - 2 <= info.mtime <= datetime.now(UTC).timestamp() + 2


def test_metadata_must_be_ascii(s3_storage: S3Storage) -> None:
    with pytest.raises(ValueError, match="must be ASCII"):
        s3_storage.write("m/k", b"x", {"segment": "caf\u00e9"})
    assert list(s3_storage.list("")) == []


def test_missing_objects_raise_chunk_not_found(s3_storage: S3Storage) -> None:
    s3_storage.write("there/a", b"x", {})
    for key in ("there/b", "there", "nowhere/a"):
        with pytest.raises(ChunkNotFound, match=repr(key)) as e:
            s3_storage.read(key, 0, 10)
        assert not s3_storage.is_temp_failure(e.value)
        with pytest.raises(ChunkNotFound):
            s3_storage.read(key, 0, 0)
        with pytest.raises(ChunkNotFound):
            s3_storage.stat(key)


def test_list_in_byte_order_across_directories(s3_storage: S3Storage) -> None:
    # SeaweedFS walks directories and would list "p/x/1" before "p/x-1".
    keys = ["p/x0", "p/x/2/deep", "p/x-1", "p/x/1", "q", "p/y"]
    for i, key in enumerate(keys):
        s3_storage.write(key, blob(i, i + 1), {"i": str(i)})
    listed = list(s3_storage.list(""))
    expected = ["p/x-1", "p/x/1", "p/x/2/deep", "p/x0", "p/y", "q"]
    assert [i.key for i in listed] == sorted(keys) == expected
    assert {i.key: i.size for i in listed} == {k: i + 1 for i, k in enumerate(keys)}
    assert [i.key for i in s3_storage.list("p/x")] == ["p/x-1", "p/x/1", "p/x/2/deep", "p/x0"]
    assert [i.key for i in s3_storage.list("p/x/")] == ["p/x/1", "p/x/2/deep"]
    assert list(s3_storage.list("nothing")) == []


def test_list_pages(s3_storage: S3Storage) -> None:
    s3_storage.list_page_size = 7
    keys = [f"many/{i % 3}/{i:03d}" for i in range(40)]
    for key in keys:
        s3_storage.write(key, b"", {})
    s3_storage.write("manz", b"", {})
    assert [i.key for i in s3_storage.list("many/")] == sorted(keys)
    assert [i.key for i in s3_storage.list("many/1/")] == sorted(k for k in keys if "/1/" in k)


def test_delete_is_idempotent(s3_storage: S3Storage) -> None:
    s3_storage.write("d/1", b"one", META)
    s3_storage.delete("d/1")
    s3_storage.delete("d/1")
    s3_storage.delete("never/written")
    with pytest.raises(ChunkNotFound):
        s3_storage.stat("d/1")
    assert list(s3_storage.list("")) == []


def test_append_is_unsupported(s3_storage: S3Storage) -> None:
    s3_storage.write("a", b"abc", {})
    with pytest.raises(BindingUnsupported, match="s3 binding does not support append"):
        s3_storage.append("a", 3, b"def", {})
    assert s3_storage.read("a", 0, 10) == b"abc"


def test_concat_three_objects(s3_storage: S3Storage) -> None:
    parts = [blob(1, MIN_PART_SIZE), blob(2, MIN_PART_SIZE + 123), blob(3, 1000)]
    for i, data in enumerate(parts):
        s3_storage.write(f"c/{i}", data, {"part": str(i)})
    s3_storage.concat("c/joined", ["c/0", "c/1", "c/2"], META)
    joined = b"".join(parts)
    assert s3_storage.read("c/joined", 0, len(joined) + 1) == joined
    assert s3_storage.read("c/joined", MIN_PART_SIZE - 5, 10) == joined[MIN_PART_SIZE - 5 :][:10]
    info = s3_storage.stat("c/joined")
    assert (info.size, dict(info.metadata)) == (len(joined), META)
    for i, data in enumerate(parts):  # the sources stay
        assert s3_storage.read(f"c/{i}", 0, len(data)) == data
    # Into one of its own sources, as when merging into a segment's first chunk.
    s3_storage.concat("c/0", ["c/0", "c/2"], {"merged": "1"})
    assert s3_storage.read("c/0", 0, len(joined)) == parts[0] + parts[2]
    assert uploads_in_progress(s3_storage) == []


def test_concat_failures_leave_nothing_behind(s3_storage: S3Storage) -> None:
    s3_storage.write("c/big", blob(1, MIN_PART_SIZE), {})
    s3_storage.write("c/small", b"tiny", {})
    with pytest.raises(ChunkNotFound, match="c/missing"):
        s3_storage.concat("c/x", ["c/big", "c/missing"], {})
    # Missing after parts were uploaded (the sizes given: no HEAD finds it first).
    with pytest.raises(ChunkNotFound, match="c/missing"):
        s3_storage.concat(
            "c/x", ["c/big", "c/small", "c/missing"], {}, sizes=[MIN_PART_SIZE, 4, 10]
        )
    # Sources shorter than the caller says: final errors, nothing made, for
    # a copied source and for a read one.
    for sources, sizes in [
        (["c/small", "c/big"], [4, MIN_PART_SIZE + 1]),
        (["c/big", "c/small", "c/big"], [MIN_PART_SIZE, 5, MIN_PART_SIZE]),
    ]:
        with pytest.raises(Tier2Error, match="shorter than") as e:
            s3_storage.concat("c/y", sources, {}, sizes=sizes)
        assert not isinstance(e.value, ChunkNotFound)
        assert not s3_storage.is_temp_failure(e.value)
    with pytest.raises(ValueError, match="2 sources but 1 sizes"):
        s3_storage.concat("c/y", ["c/small", "c/big"], {}, sizes=[4])
    assert [i.key for i in s3_storage.list("c/")] == ["c/big", "c/small"]
    assert uploads_in_progress(s3_storage) == []


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        [0, 0],
        [1],
        [4096] * 3000,
        [MIN_PART_SIZE - 1, 1, MIN_PART_SIZE - 1, MIN_PART_SIZE, 7],
        [10, 3 * MIN_PART_SIZE, 10, 0, 2 * MIN_PART_SIZE + 5, MIN_PART_SIZE - 2, 3],
        [12 * 1024**3, 1],
    ],
)
def test_plan_concat(sizes: list[int]) -> None:
    """Parts cover the sources in order; all but the last >= 5 MiB; big bytes copied."""
    plan = plan_concat(sizes)
    pieces = [piece for part in plan for piece in part.pieces]
    assert all(start < end <= sizes[index] for index, start, end in pieces)
    # Contiguous and in order: each piece goes on where the one before ended,
    # or starts the next source after finishing its own.
    for (i1, _, e1), (i2, s2, _) in itertools.pairwise(pieces):
        assert (i2 == i1 and s2 == e1) or (i2 > i1 and s2 == 0 and e1 == sizes[i1])
    assert [i for i, start, _ in pieces if start == 0] == [i for i, n in enumerate(sizes) if n]
    assert sum(end - start for _, start, end in pieces) == sum(sizes)
    for part in plan[:-1]:
        assert MIN_PART_SIZE <= part.size <= MAX_PART_SIZE
    assert all(len(part.pieces) == 1 for part in plan if part.copy)
    # Re-uploaded: the small sources, plus at most 5 MiB per big source after small ones.
    uploaded = sum(part.size for part in plan if not part.copy)
    small = sum(size for size in sizes if size < MIN_PART_SIZE)
    big_count = sum(1 for size in sizes if size >= MIN_PART_SIZE)
    assert uploaded <= small + big_count * MIN_PART_SIZE


KiB = 1024

#: Source shapes of a storage-optimizer merge (issue 33): trickle chunks of a
#: few KiB, 1 MiB flushes, small ones before and after a big merged chunk, an
#: empty source, and a big one that is padded into the part before it.
CONCAT_SHAPES = {
    "trickle 40 x 4 KiB": [4 * KiB] * 39 + [4 * KiB + 7],
    "16 x 1 MiB": [MIN_PART_SIZE // 5] * 16,
    "big then trickle": [MIN_PART_SIZE + 3] + [64 * KiB] * 20,
    "trickle then big then trickle": [3000] * 5 + [MIN_PART_SIZE + 1] + [0] + [1 * 1024 * KiB] * 3,
    "trickle then big remainder under 5 MiB": [64 * KiB, MIN_PART_SIZE + 100, 10, 20],
    "small last after big": [MIN_PART_SIZE, 1],
}


class RequestCounter:
    """Counts the S3 operations a client makes (botocore's before-call event)."""

    def __init__(self, storage: S3Storage) -> None:
        self.counts: dict[str, int] = {}
        storage.client.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **kwargs: Any) -> None:
        self.counts[model.name] = self.counts.get(model.name, 0) + 1


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(CONCAT_SHAPES))
def test_concat_sources_under_5_mib(s3_storage: S3Storage, shape: str) -> None:
    """Small sources anywhere in the list are read and uploaded; big ones still copied."""
    sizes = CONCAT_SHAPES[shape]
    parts = [blob(100 + i, size) for i, size in enumerate(sizes)]
    sources = [f"t/src/{i:03d}" for i in range(len(parts))]
    for key, data in zip(sources, parts, strict=True):
        s3_storage.write(key, data, {"part": key})
    s3_storage.concat("t/joined", sources, META)
    joined = b"".join(parts)
    assert s3_storage.read("t/joined", 0, len(joined) + 1) == joined
    info = s3_storage.stat("t/joined")
    assert (info.size, dict(info.metadata)) == (len(joined), META)
    for key, data in zip(sources, parts, strict=True):  # the sources stay
        assert s3_storage.read(key, 0, len(data) + 1) == data
    # Into its own first source (the optimizer's merge into a segment's first chunk).
    s3_storage.concat(sources[0], sources, {"merged": "1"})
    assert s3_storage.read(sources[0], 0, len(joined) + 1) == joined
    assert uploads_in_progress(s3_storage) == []


@pytest.mark.slow
def test_concat_copies_big_sources_and_reads_only_small_ones(s3_storage: S3Storage) -> None:
    """A big chunk followed by trickle chunks: the big one never leaves the server."""
    big = blob(1, MIN_PART_SIZE + 3)
    small = [blob(2 + i, 4 * KiB) for i in range(30)]
    sources = ["m/big"] + [f"m/s{i:02d}" for i in range(30)]
    for key, data in zip(sources, [big, *small], strict=True):
        s3_storage.write(key, data, {})
    counter = RequestCounter(s3_storage)
    s3_storage.concat("m/joined", sources, {}, sizes=[len(big)] + [4 * KiB] * 30)
    assert s3_storage.read("m/joined", 0, 2 * MIN_PART_SIZE) == big + b"".join(small)
    # With the sizes given: no HEAD; one copy, 30 small GETs, one part of them.
    assert counter.counts == {
        "CreateMultipartUpload": 1,
        "UploadPartCopy": 1,
        "GetObject": 30 + 1,  # + the read-back above
        "UploadPart": 1,
        "CompleteMultipartUpload": 1,
    }


@pytest.mark.slow
def test_concat_of_small_sources_only_is_one_put(s3_storage: S3Storage) -> None:
    """Under 5 MiB in all: N GETs and one PUT, no multipart upload."""
    parts = [blob(i, 2 * KiB + i) for i in range(10)]
    sources = [f"p/{i}" for i in range(10)]
    for key, data in zip(sources, parts, strict=True):
        s3_storage.write(key, data, {})
    counter = RequestCounter(s3_storage)
    s3_storage.concat("p/joined", sources, META)
    assert counter.counts == {"HeadObject": 10, "GetObject": 10, "PutObject": 1}
    assert s3_storage.read("p/joined", 0, 1 << 20) == b"".join(parts)
    assert dict(s3_storage.stat("p/joined").metadata) == META


def test_concat_of_nothing_is_empty(s3_storage: S3Storage) -> None:
    s3_storage.concat("c/none", [], {"k": "v"})
    assert s3_storage.read("c/none", 0, 10) == b""
    assert dict(s3_storage.stat("c/none").metadata) == {"k": "v"}


def test_prefix_is_added_and_removed(s3_storage: S3Storage, seaweedfs: EmbeddedS3) -> None:
    def on(prefix: str) -> S3Storage:
        return S3Storage(
            s3_storage.bucket,
            prefix,
            endpoint_url=seaweedfs.endpoint_url,
            access_key=seaweedfs.access_key,
            secret_key=seaweedfs.secret_key,
        )

    inner = on("/tenant/a/")
    other = S3Storage.from_url(
        f"s3://{s3_storage.bucket}/tenant/ab",
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    try:
        assert (inner.prefix, other.prefix) == ("tenant/a", "tenant/ab")
        inner.write("n/chunks/1", b"in a", META)
        other.write("n/chunks/1", b"in ab", {})
        s3_storage.write("n/chunks/1", b"at the root", {})
        # Each sees its own keys, relative; a/ does not see ab/.
        assert [i.key for i in inner.list("")] == ["n/chunks/1"]
        assert [i.key for i in inner.list("n/")] == ["n/chunks/1"]
        assert [i.key for i in other.list("")] == ["n/chunks/1"]
        assert inner.read("n/chunks/1", 0, 100) == b"in a"
        assert inner.stat("n/chunks/1").key == "n/chunks/1"
        assert [i.key for i in s3_storage.list("")] == [
            "n/chunks/1",
            "tenant/a/n/chunks/1",
            "tenant/ab/n/chunks/1",
        ]
        inner.write("big", blob(5, MIN_PART_SIZE), {})
        inner.concat("joined", ["big", "n/chunks/1"], {})
        assert s3_storage.read("tenant/a/joined", MIN_PART_SIZE, 100) == b"in a"
        inner.delete("n/chunks/1")
        assert s3_storage.read("tenant/ab/n/chunks/1", 0, 100) == b"in ab"
    finally:
        inner.close()
        other.close()


@pytest.mark.parametrize(
    "url", ["s3:/bucket", "http://bucket/x", "s3://", "s3://bucket/x?versionId=1", "bucket/x"]
)
def test_from_url_rejects_other_urls(url: str) -> None:
    with pytest.raises(ValueError, match="s3://BUCKET"):
        S3Storage.from_url(url)


def test_from_url_without_prefix() -> None:
    storage = S3Storage.from_url("s3://some-bucket", endpoint_url="http://127.0.0.1:9")
    try:
        assert (storage.bucket, storage.prefix) == ("some-bucket", "")
    finally:
        storage.close()


def client_error(status: int, code: str, headers: dict[str, str] | None = None) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "test"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
    }
    return ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("exc", "temporary"),
    [
        (client_error(503, "SlowDown"), True),
        (client_error(500, "InternalError"), True),
        (client_error(502, "BadGateway"), True),
        (client_error(429, "TooManyRequests"), True),
        (client_error(400, "RequestTimeout"), True),
        (client_error(403, "RequestTimeTooSkewed"), True),
        (client_error(400, "Throttling"), True),
        (client_error(400, "ThrottlingException"), True),
        (client_error(404, "NoSuchKey"), False),
        (client_error(404, "NoSuchBucket"), False),
        (client_error(403, "AccessDenied"), False),
        (client_error(400, "EntityTooSmall"), False),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"), True),
        (botocore.exceptions.ResponseStreamingError(error="cut"), True),
        (botocore.exceptions.IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (urllib3.exceptions.ProtocolError("Connection aborted."), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), True),  # type: ignore[arg-type]
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError(), True),
        (botocore.exceptions.NoCredentialsError(), False),
        (ChunkNotFound("k"), False),
        (ValueError("no"), False),
        (OSError(28, "No space left on device"), False),
    ],
)
def test_is_temp_failure(exc: BaseException, temporary: bool) -> None:
    assert is_temp_failure(exc) is temporary


def test_retry_after() -> None:
    assert retry_after(client_error(503, "SlowDown", {"retry-after": "2"})) == 2.0
    assert retry_after(client_error(503, "SlowDown", {"retry-after": "0.25"})) == 0.25
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    asked = retry_after(client_error(503, "SlowDown", {"retry-after": when}))
    assert asked is not None and 25 <= asked <= 31
    assert retry_after(client_error(503, "SlowDown", {"retry-after": "soon"})) is None
    assert retry_after(client_error(503, "SlowDown")) is None
    assert retry_after(ConnectionResetError()) is None


def test_write_if_absent_is_enforced_by_the_server(s3_storage: S3Storage) -> None:
    # If-None-Match: * -- the cluster's name claims and epoch fences rest on it.
    assert s3_storage.write_if_absent("claims/k", b"first", {"node": "a"})
    assert not s3_storage.write_if_absent("claims/k", b"second", {"node": "b"})
    assert s3_storage.read("claims/k", 0, 100) == b"first"
    assert s3_storage.stat("claims/k").metadata == {"node": "a"}
    s3_storage.delete("claims/k")
    assert s3_storage.write_if_absent("claims/k", b"third", {})
    assert s3_storage.read("claims/k", 0, 100) == b"third"
