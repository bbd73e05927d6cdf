"""The one retry policy, alone (fake failures, trio's virtual clock) and in the chunk layer.

The layer tests put a fault-injecting proxy (tests/helpers/s3proxy.py)
between the S3 binding and the session's SeaweedFS: S3 error bursts, reset
connections and a dead endpoint, as boto3 really sees them.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Iterator

import pytest
import trio
import trio.lowlevel
import trio.testing

from gateway.embedded import EmbeddedS3
from gateway.errors import BindingUnsupported, ChunkCorrupt, ChunkNotFound, Tier2Error
from gateway.storage.layer import ChunkLayer
from gateway.storage.retry import RetryEvent, retrying
from gateway.storage.s3 import S3Storage

from .helpers.s3proxy import S3FaultProxy

MiB = 1024 * 1024


class Flaky(Exception):
    """A temporary failure, for the fakes."""


class Broken(Exception):
    """A final failure, for the fakes."""


def is_flaky(exc: BaseException) -> bool:
    return isinstance(exc, Flaky)


class FailingCall:
    """An async call that raises ``failures`` (in order) before returning ``result``."""

    def __init__(self, *failures: BaseException, result: object = "done") -> None:
        self.failures = list(failures)
        self.result = result
        self.calls = 0
        self.times: list[float] = []

    async def __call__(self) -> object:
        self.calls += 1
        self.times.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        if self.failures:
            raise self.failures.pop(0)
        return self.result


# -- the policy -------------------------------------------------------------------


async def test_temporary_failures_are_retried_with_bounded_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    random.seed(1)
    call = FailingCall(*[Flaky(f"503 number {i}") for i in range(8)], result=42)
    events: list[RetryEvent] = []
    result = await retrying(
        call,
        is_temp_failure=is_flaky,
        what="write 'k'",
        deadline=60,
        first_delay=0.1,
        max_delay=1.0,
        on_retry=events.append,
    )
    assert result == 42
    assert call.calls == 9
    assert [e.attempt for e in events] == list(range(1, 9))
    assert all(isinstance(e.error, Flaky) and e.what == "write 'k'" for e in events)
    for e in events:  # full jitter under a doubling, capped bound
        assert 0 <= e.delay <= min(1.0, 0.1 * 2 ** (e.attempt - 1))
    waits = [b - a for a, b in zip(call.times, call.times[1:], strict=False)]
    assert waits == pytest.approx([e.delay for e in events])
    assert sum(waits) <= 0.1 + 0.2 + 0.4 + 1.0 * 5


async def test_deadline_ends_retrying(autojump_clock: trio.testing.MockClock) -> None:
    call = FailingCall(*[Flaky("SlowDown") for _ in range(10_000)])
    start = trio.current_time()
    with pytest.raises(Tier2Error) as e:
        await retrying(
            call, is_temp_failure=is_flaky, what="read 'k' [0, 10)", deadline=30, max_delay=2.0
        )
    elapsed = trio.current_time() - start
    assert 30 <= elapsed <= 30.001  # the last wait ends at the deadline, not past it
    message = str(e.value)
    assert message.startswith("Tier 2 failed: read 'k' [0, 10): SlowDown (gave up after ")
    assert f"after {call.calls} attempts in 30.0 s" in message
    assert isinstance(e.value.__cause__, Flaky)
    assert type(e.value) is Tier2Error


async def test_final_failures_are_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    call = FailingCall(Broken("AccessDenied"))
    with pytest.raises(Tier2Error) as e:
        await retrying(call, is_temp_failure=is_flaky, what="stat 'k'", deadline=60)
    assert call.calls == 1
    assert str(e.value) == "Tier 2 failed: stat 'k': AccessDenied"
    assert isinstance(e.value.__cause__, Broken)
    # An exception without text is named by its type.
    with pytest.raises(Tier2Error, match=r"stat 'k': Broken$"):
        await retrying(FailingCall(Broken()), is_temp_failure=is_flaky, what="stat 'k'", deadline=1)


@pytest.mark.parametrize(
    "error",
    [ChunkNotFound("k"), ChunkCorrupt("k", "bad crc"), BindingUnsupported("s3", "append")],
)
async def test_tier2_errors_pass_through_unchanged(
    error: Tier2Error, autojump_clock: trio.testing.MockClock
) -> None:
    call = FailingCall(Flaky("first"), error)
    with pytest.raises(Tier2Error) as e:
        await retrying(call, is_temp_failure=is_flaky, what="x", deadline=60)
    assert e.value is error
    assert call.calls == 2


async def test_retry_after_is_honoured_above_max_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    call = FailingCall(Flaky("503"), Flaky("503"))
    await retrying(
        call,
        is_temp_failure=is_flaky,
        what="x",
        deadline=60,
        retry_after=lambda exc: 7.5,
        max_delay=0.5,
    )
    waits = [b - a for a, b in zip(call.times, call.times[1:], strict=False)]
    assert waits == pytest.approx([7.5, 7.5])


async def test_retry_after_is_capped_by_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    call = FailingCall(*[Flaky("503") for _ in range(10)])
    start = trio.current_time()
    with pytest.raises(Tier2Error, match="gave up after 2 attempts"):
        await retrying(
            call, is_temp_failure=is_flaky, what="x", deadline=5, retry_after=lambda exc: 3600
        )
    assert trio.current_time() - start == pytest.approx(5)


async def test_log_level_rises_with_attempts(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.storage.retry")
    call = FailingCall(*[Flaky(f"e{i}") for i in range(7)])
    await retrying(call, is_temp_failure=is_flaky, what="write 'k'", deadline=600)
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.DEBUG] * 2 + [logging.INFO] * 3 + [logging.WARNING] * 2
    assert "write 'k': temporary failure (attempt 7): e6; retrying in" in caplog.records[-1].message


async def test_cancellation_is_not_a_failure(autojump_clock: trio.testing.MockClock) -> None:
    call = FailingCall(*[Flaky("503") for _ in range(1000)])
    with trio.move_on_after(3) as scope:
        await retrying(call, is_temp_failure=is_flaky, what="x", deadline=60)
    assert scope.cancelled_caught


# -- the chunk layer through a fault-injecting proxy --------------------------------


@pytest.fixture
def proxy(seaweedfs: EmbeddedS3) -> Iterator[S3FaultProxy]:
    """A proxy in front of the session's SeaweedFS."""
    with S3FaultProxy(seaweedfs.endpoint_url, seed=7) as p:
        yield p


def storage_via(
    endpoint_url: str, bucket: str, *, timeout: float = 5.0, server: EmbeddedS3 | None = None
) -> S3Storage:
    return S3Storage(
        bucket,
        endpoint_url=endpoint_url,
        timeout=timeout,
        # The embedded server refuses any credentials but its own.
        access_key=server.access_key if server else "test",
        secret_key=server.secret_key if server else "test",
    )


@pytest.fixture
def layer(
    proxy: S3FaultProxy, s3_storage: S3Storage, seaweedfs: EmbeddedS3
) -> Iterator[ChunkLayer]:
    """A chunk layer whose S3 requests go through ``proxy`` (same bucket as ``s3_storage``)."""
    storage = storage_via(proxy.endpoint_url, s3_storage.bucket, server=seaweedfs)
    yield ChunkLayer(storage, max_concurrency=4, retry_deadline=20)
    storage.close()


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_layer_retries_slow_down_bursts(
    layer: ChunkLayer, proxy: S3FaultProxy, s3_storage: S3Storage
) -> None:
    data = blob(1, 3 * MiB + 5)
    proxy.fail(3, method="PUT")
    await layer.write("n/chunks/1/0", data, {"crc32c": "0"})
    proxy.fail(2, method="GET", status=500, code="InternalError")
    assert await layer.read("n/chunks/1/0", 0, len(data)) == data
    proxy.fail(1, method="HEAD", status=429, code="TooManyRequests")
    assert (await layer.stat("n/chunks/1/0")).size == len(data)
    assert s3_storage.read("n/chunks/1/0", 0, len(data)) == data  # past the proxy
    stats = layer.statistics()
    assert proxy.injected["error"] == 6
    assert (stats.retries, stats.failures) == (6, 0)
    assert stats.requests == 3 + 6
    assert dict(stats.requests_by_operation) == {"write": 4, "read": 3, "stat": 2}
    assert (stats.bytes_written, stats.bytes_read) == (len(data), len(data))


async def test_layer_retries_dropped_connections(
    layer: ChunkLayer, proxy: S3FaultProxy, s3_storage: S3Storage
) -> None:
    data = blob(2, 4 * MiB)
    proxy.drop(2, when="request", method="PUT")
    proxy.drop(1, when="response", method="PUT")
    await layer.write("k", memoryview(data), {})
    proxy.drop(3, when="response", method="GET")  # bodies cut half-way
    proxy.drop(1, when="request", method="GET")
    got = [await layer.read("k", offset, MiB) for offset in range(0, len(data), MiB)]
    assert b"".join(got) == data
    assert s3_storage.read("k", 0, len(data)) == data
    assert proxy.injected["drop_request"] == 3 and proxy.injected["drop_response"] == 4
    assert layer.statistics().retries == 7


async def test_layer_under_random_faults_loses_nothing(
    layer: ChunkLayer, proxy: S3FaultProxy, s3_storage: S3Storage
) -> None:
    proxy.fail(None, fraction=0.2)
    proxy.drop(None, when="response", fraction=0.1)
    proxy.drop(None, when="request", fraction=0.05)
    blobs = {f"r/{i}": blob(i, 20_000 + i * 1000) for i in range(16)}

    async def roundtrip(key: str, data: bytes) -> None:
        await layer.write(key, data, {"n": key[2:]})
        assert await layer.read(key, 1000, 5000) == data[1000:6000]

    async with trio.open_nursery() as nursery:
        for key, data in blobs.items():
            nursery.start_soon(roundtrip, key, data)
    proxy.clear()
    listed = await layer.list("r/")
    assert sorted(i.key for i in listed) == sorted(blobs)
    for key, data in blobs.items():
        assert s3_storage.read(key, 0, len(data) + 1) == data
    assert sum(proxy.injected.values()) > 0
    assert layer.statistics().retries == sum(proxy.injected.values())


async def test_layer_rides_out_a_short_outage(
    layer: ChunkLayer, proxy: S3FaultProxy, s3_storage: S3Storage
) -> None:
    proxy.drop(None, when="request")
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(layer.write, "during/outage", b"kept", {})
        await trio.sleep(1.0)
        proxy.clear()  # S3 is back
    assert time.monotonic() - start >= 1.0
    assert s3_storage.read("during/outage", 0, 10) == b"kept"
    assert layer.statistics().retries >= 3


async def test_layer_honours_retry_after(layer: ChunkLayer, proxy: S3FaultProxy) -> None:
    proxy.fail(1, method="PUT", retry_after=0.6)
    start = time.monotonic()
    await layer.write("ra", b"x", {})
    assert time.monotonic() - start >= 0.6


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.serial  # a wall-time bound of a second or two (tests/conftest.py)
@pytest.mark.parametrize("deadline", [0.3, 1.5])
async def test_layer_gives_up_after_the_deadline_when_s3_stays_down(deadline: float) -> None:
    with S3FaultProxy(f"http://127.0.0.1:{closed_port()}") as dead:
        storage = storage_via(dead.endpoint_url, "bucket")
        layer = ChunkLayer(storage, retry_deadline=deadline)
        try:
            start = time.monotonic()
            with pytest.raises(Tier2Error) as e:
                await layer.write("k", b"data", {})
            elapsed = time.monotonic() - start
        finally:
            storage.close()
    assert deadline <= elapsed < deadline + 1.5
    assert type(e.value) is Tier2Error
    assert str(e.value).startswith("Tier 2 failed: write 'k' (4 bytes) on s3: ")
    assert "gave up after" in str(e.value)
    stats = layer.statistics()
    assert stats.failures == 1 and stats.retries >= 2 and stats.bytes_written == 0


async def test_layer_does_not_retry_final_errors(layer: ChunkLayer, proxy: S3FaultProxy) -> None:
    with pytest.raises(ChunkNotFound):
        await layer.read("missing", 0, 10)
    proxy.fail(1, status=403, code="AccessDenied")
    with pytest.raises(Tier2Error, match=r"delete 'k' on s3: .*AccessDenied"):
        await layer.delete("k")
    with pytest.raises(BindingUnsupported):
        await layer.append("k", 0, b"x", {})
    stats = layer.statistics()
    assert (stats.retries, stats.not_found, stats.failures) == (0, 1, 2)
