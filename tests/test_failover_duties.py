"""A taken-over container keeps its duties: transactions, rolls, retention, flushes, GC.

Three (for the second kill, four) replicating daemons on one SeaweedFS bucket
with ``cluster.takeover = true``. node-c is killed with SIGKILL and a survivor
runs its container (`gateway.cluster.failover`); what a user of node-c's
segments checks then: a transaction left open on the dead node is committed
whole or aborted (by the timeout, on the new host), a stream goes on rolling
by age and expiring by retention, appends reach Tier 2, garbage is collected,
exactly one survivor hosts the container, and a host that dies in turn hands
it on.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import time
from collections.abc import Iterator

import pytest
import trio

from gateway.client.client import Client, open_client
from gateway.embedded import EmbeddedS3
from gateway.errors import GatewayError, NoQuorum, OwnerDown, SegmentNotFound, Unavailable
from gateway.storage import object_keys as names
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import scrape
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.wait import async_wait_for

pytestmark = pytest.mark.slow

EXPECTED_ERRORS = (
    "cluster: .*", "replication: .*", "connection .*", "failover: .*", "recovery: .*",
    "handover: .*", "handback: .*",
)  # fmt: skip

#: The container's duties run often here (every node's config; a hosted
#: container runs with its host's): the stream sweep (rolls, retention,
#: transaction timeouts), flushes of anything two seconds old, GC of any
#: garbage at once.
TIER2_KEYS = 'flush_interval = "2s"\ngc_interval = "1s"\ngc_grace = "0s"\n'
STREAMS = '[streams]\ninterval = "0.5s"\n'


def _cluster(
    root: pathlib.Path, s3: EmbeddedS3, nodes: tuple[str, ...] = ("node-a", "node-b", "node-c")
) -> ReplicatedCluster:
    c = ReplicatedCluster(root, s3, nodes=nodes, takeover=True, extra=STREAMS)
    for d in c.daemons.values():
        text = d.config_path.read_text()
        # The helper's [tier2] flushes only when asked and never collects: replace that.
        text = text.replace('flush_interval = "24h"\n', "")
        d.config_path.write_text(text.replace("[tier2]\n", "[tier2]\n" + TIER2_KEYS, 1))
    return c


@pytest.fixture
def cluster(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3) -> Iterator[ReplicatedCluster]:
    c = _cluster(tmp_path, seaweedfs)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


@pytest.fixture
def cluster4(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3) -> Iterator[ReplicatedCluster]:
    c = _cluster(tmp_path, seaweedfs, ("node-a", "node-b", "node-c", "node-d"))
    try:
        c.start()
        yield c
    finally:
        c.teardown()


async def _status(c: ReplicatedCluster, via: str, node: str) -> tuple[str, str]:
    """(hosted_by, advertise) of ``node`` as ``via`` sees the registry; ("", "") while
    ``via`` does not see it up."""
    async with open_client(c.daemons[via].address) as cl:
        status = {n.id: n for n in await cl.cluster()}
    if status[node].state != "up":
        return "", ""
    return status[node].hosted_by, status[node].advertise


async def _wait_hosted(
    c: ReplicatedCluster, via: str, node: str, not_on: tuple[str, ...] = (), within: float = 60
) -> tuple[str, str]:
    """Until ``node``'s container serves on another host (not one of ``not_on``):
    (host, address)."""
    seen: list[tuple[str, str]] = []

    async def hosted() -> bool:
        try:
            host, address = await _status(c, via, node)
        except (GatewayError, OSError):
            return False
        seen.append((host, address))
        return bool(host) and host not in not_on

    await async_wait_for(hosted, within, f"{node}'s container hosted")
    return seen[-1]


async def _first_append(cl: Client, segment: str, data: bytes, within: float = 30) -> float:
    """Append once the new host takes changes; how long it answered "not yet".

    Right after a takeover a survivor may still see the owner down (`OwnerDown`)
    and the new host's replication may still be starting (`Unavailable`): neither
    wrote anything, so sending again is safe (an exactly-once writer does the same).
    """
    started = time.monotonic()
    last: GatewayError | None = None
    with trio.fail_after(within):
        while True:
            try:
                await cl.append(segment, data)
            except NoQuorum:
                raise  # it may still become durable: not safe to send again
            except (OwnerDown, Unavailable) as e:
                last = e
                await trio.sleep(0.05)
                continue
            waited = time.monotonic() - started
            if last is not None:
                print(f"first append to {segment} after {waited:.2f}s; before: {last}")
            return waited


def _kill(c: ReplicatedCluster, node: str) -> float:
    c.daemons[node].kill()
    return time.monotonic()


async def _kill_holding_one_segment(c: ReplicatedCluster) -> str:
    """node-c with ``dead/x`` holding ``before``, killed; the node that took it over
    (as node-a sees it)."""
    async with open_client(c.daemons["node-c"].address) as cl:
        await cl.create("dead/x")
        await cl.append("dead/x", b"before")
    _kill(c, "node-c")
    host, _ = await _wait_hosted(c, "node-a", "node-c")
    return host


def _event(i: int) -> bytes:
    return b"event-%06d\n" % i


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_transactions_open_on_a_dead_node_commit_whole_or_time_out(
    cluster: ReplicatedCluster,
) -> None:
    """Two transactions begun on node-c, events in both, kill -9: one is committed
    through a survivor after the takeover (its events appear once, whole), the other
    is left alone and the new host's timeout sweep aborts it (none of its events
    ever appear, it is gone, and a late commit says it timed out)."""
    c = cluster
    dead = c.daemons["node-c"]
    async with open_client(dead.address) as cl:
        await cl.create("dead/orders", codec="lines")
        await cl.append("dead/orders", b"before\n")
        kept = await cl.begin_transaction("dead/orders", txn_timeout=600)
        left = await cl.begin_transaction("dead/orders", txn_timeout=20)
        for i in range(0, 200):
            await cl.append(kept.name, _event(i))
            await cl.append(left.name, b"never-%06d\n" % i)
    _kill(c, "node-c")
    # The sweep must not have run on node-c: the left one's deadline is still ahead.
    assert left.deadline_ms > time.time() * 1000 + 5000

    host, address = await _wait_hosted(c, "node-a", "node-c")
    assert host in ("node-a", "node-b")
    kept_body = b"".join(_event(i) for i in range(200))
    # Through the new host's address (`cluster` shows it): the transaction is there.
    async with open_client(address) as cl:
        # More events into the kept one after the takeover, then its commit.
        await _first_append(cl, kept.name, _event(200))
        for i in range(201, 300):
            await cl.append(kept.name, _event(i))
        kept_body += b"".join(_event(i) for i in range(200, 300))
        done = await cl.commit_transaction(kept.name)
        assert (done.segment, done.offset, done.length) == (
            "dead/orders",
            len(b"before\n"),
            len(kept_body),
        )
        # The left one: aborted by the sweep on the new host, never committed.

        async def swept() -> bool:
            try:
                await cl.info(left.name)
            except SegmentNotFound:
                return True
            return False

        await async_wait_for(swept, 60, "the left transaction aborted by its timeout")
        assert time.time() * 1000 >= left.deadline_ms
        with pytest.raises(GatewayError, match="timed out") as e:
            await cl.commit_transaction(left.name)
        assert e.value.exit_code == 41
        # A commit sent again answers the same (the record of outcomes moved too).
        assert await cl.commit_transaction(kept.name) == done

    # Read back on the owner and through both survivors: the kept events once, whole,
    # none of the left one's.
    for where in (address, c.daemons["node-a"].address, c.daemons["node-b"].address):
        async with open_client(where) as cl:

            async def read_back(cl: object = cl) -> bool:
                info = await cl.info("dead/orders")  # type: ignore[attr-defined]
                data = (await cl.read("dead/orders", 0, info.length)).data  # type: ignore[attr-defined]
                return bool(data == b"before\n" + kept_body)

            await async_wait_for(read_back, 30, f"dead/orders through {where}")
            info = await cl.info("dead/orders")
            assert info.event_count == 301
            assert not [s.name for s in await cl.list("dead/") if s.name != "dead/orders"]
    async with open_client(address) as cl:
        assert [s.name for s in await cl.list(".txn")] == []


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_transaction_of_a_dead_node_is_committed_through_a_survivor(
    cluster: ReplicatedCluster,
) -> None:
    """A transaction begun through node-a on node-c's segment (node-a redirects the
    client to node-c), node-c killed: after the takeover the same client, and a new
    one connected to node-b, follow the transaction to its new host -- appends and the
    commit succeed and its events appear once, whole."""
    c = cluster
    async with open_client(c.daemons["node-c"].address) as cl:
        await cl.create("dead/orders", codec="lines")
    async with open_client(c.daemons["node-a"].address) as cl:
        txn = await cl.begin_transaction("dead/orders", txn_timeout=600)
        assert cl.redirects == 1
        await cl.append(txn.name, _event(0))
        _kill(c, "node-c")
        _, address = await _wait_hosted(c, "node-a", "node-c")
        body = _event(0) + _event(1) + _event(2)
        # Its name says whose container it is (`.txn/node-c/...`): every node
        # sends a client to wherever that runs now.
        assert txn.name.startswith(".txn/node-c/")
        try:
            await cl.append(txn.name, _event(1))  # the client that began it
            async with open_client(c.daemons["node-b"].address) as other:
                await other.append(txn.name, _event(2))  # a client that never saw it
                done = await other.commit_transaction(txn.name)
        except Exception:
            async with open_client(address) as owner:
                print("the transaction on its new host:", await owner.info(txn.name))
            raise
    assert (done.segment, done.offset, done.length) == ("dead/orders", 0, len(body))
    async with open_client(c.daemons["node-b"].address) as cl:
        assert (await cl.read("dead/orders", 0, 1000)).data == body


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_taken_over_stream_keeps_rolling_expiring_flushing_and_collecting(
    cluster: ReplicatedCluster, seaweedfs: EmbeddedS3
) -> None:
    """A stream of node-c rolled by age (2 s) and expired by age (8 s): after the
    takeover, appends through a survivor go on, new segments appear every roll_age,
    the segments from before the kill are deleted by retention, and what is kept is
    the newest events in order. Appends to a plain segment of node-c reach Tier 2
    (by the flush interval, and by an explicit flush), and a garbage object under
    node-c's prefix is collected."""
    c = cluster
    dead = c.daemons["node-c"]
    policy = {"roll_age_ms": 2000, "retain_age_ms": 8000, "roll_size": 0, "retain_size": 0}
    written: list[bytes] = []
    async with open_client(dead.address) as cl:
        await cl.create_stream("clicks", policy, codec="lines")
        await cl.create("dead/plain")
        await cl.create("dead/flushed")
        for i in range(20):
            written.append(_event(i))
            await cl.append("clicks", written[-1])
            await trio.sleep(0.1)
        before = [s.name for s in (await cl.stream("clicks")).segments]
    assert before  # the stream's first segment(s), from before the kill
    _kill(c, "node-c")
    host, address = await _wait_hosted(c, "node-a", "node-c")

    # Appends go on through a survivor for a while; they land in segments the new
    # host rolls every 2 s.
    landed: dict[str, float] = {}
    async with open_client(c.daemons["node-b"].address) as cl:
        await _first_append(cl, "dead/plain", b"after the takeover " * 100)
        await cl.append("dead/flushed", b"flushed on request " * 100)
        started = time.monotonic()
        while time.monotonic() - started < 14:
            written.append(_event(len(written)))
            r = await cl.append("clicks", written[-1])
            landed.setdefault(r.segment, time.monotonic() - started)
            await trio.sleep(0.2)
        await cl.flush("dead/flushed")
    new = [s for s in landed if s not in before]
    print(f"host {host}; segments (s after the first append): {landed}")
    # Rolled by age on the new host: one segment per ~2 s (a sweep every 0.5 s).
    assert len(new) >= 4, landed
    gaps = [b - a for a, b in itertools.pairwise(list(landed.values())[1:])]
    assert all(g <= 4.5 for g in gaps), landed

    async with open_client(address) as owner:
        # Flushed by request: in Tier 2 as soon as flush returned.
        info = await owner.info("dead/flushed")
        assert info.storage_length == info.length == len(b"flushed on request " * 100)

        # Flushed by the flush interval (2 s) on the new host, unasked.
        async def plain_flushed() -> bool:
            i = await owner.info("dead/plain")
            return i.length > 0 and i.storage_length == i.length

        await async_wait_for(plain_flushed, 30, "dead/plain flushed by the new host")

        # Retention by age on the new host: the segments from before the kill go.
        async def expired() -> bool:
            segs = [s.name for s in (await owner.stream("clicks")).segments]
            return not set(before) & set(segs)

        await async_wait_for(expired, 40, "the segments from before the kill expired")
        kept = (await owner.stream("clicks")).segments
        assert kept, "retention deleted the current segment"
        kept_bytes = b"".join(
            [(await owner.read(s.name, s.start_offset, s.length)).data for s in kept]
        )
        assert kept_bytes and b"".join(written).endswith(kept_bytes)
        assert kept_bytes.startswith(b"event-")
        for name in before:
            with pytest.raises(SegmentNotFound):
                await owner.info(name)

    # GC on the new host: an object under node-c's chunks prefix that no metadata
    # names (what a crash between an upload and its record leaves) is deleted.
    storage = S3Storage(
        c.bucket,
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
    )
    try:
        garbage = "gw/" + names.chunk_key("node-c", 999_999, 0, 1)
        await trio.to_thread.run_sync(lambda: storage.write(garbage, b"nobody names me", {}))
        keys = lambda: {o.key for o in storage.list("gw/" + names.chunks_prefix("node-c"))}  # noqa: E731
        assert garbage in await trio.to_thread.run_sync(keys)

        async def collected() -> bool:
            return garbage not in await trio.to_thread.run_sync(keys)

        await async_wait_for(collected, 30, "the garbage object collected on the new host")
    finally:
        storage.close()


_TAKING = re.compile(r"failover: node node-c is \w+ .*taking its container over here")
_LOST = re.compile(r"failover: node node-c \(epoch \d+\) is taken over by (node-\w)")


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_exactly_one_survivor_takes_a_dead_node_over(cluster: ReplicatedCluster) -> None:
    """After kill -9 of node-c, exactly one of node-a and node-b says it takes the
    container over and runs it (``hosted/node-c`` on its disk); the other says who won,
    or never tried; and that stays so (no second takeover later)."""
    c = cluster
    host = await _kill_holding_one_segment(c)
    assert (await _wait_hosted(c, "node-b", "node-c"))[0] == host  # node-b sees the same
    await trio.sleep(6)  # two more down_after periods: nobody else tries
    survivors = ("node-a", "node-b")
    taking = [n for n in survivors if _TAKING.search(c.daemons[n].log_path.read_text())]
    hosting = [n for n in survivors if (c.daemons[n].data_dir / "hosted" / "node-c").exists()]
    assert taking == [host] and hosting == [host], (taking, hosting)
    other = next(n for n in survivors if n != host)
    lost = _LOST.findall(c.daemons[other].log_path.read_text())
    assert set(lost) <= {host}, lost
    print(f"{host} took node-c over; {other} {'saw it' if lost else 'never tried'}")
    # What an operator's dashboard shows: one takeover, on the host, serving.
    metrics = {n: scrape(c.daemons[n].metrics_port) for n in survivors}
    assert metrics[host]["segment_gateway_takeovers_total"] == 1
    assert metrics[host]['segment_gateway_hosted_container{node="node-c",state="serving"}'] == 1
    assert metrics[other].get("segment_gateway_takeovers_total", 0) == 0
    assert not any(k.startswith("segment_gateway_hosted_container{") for k in metrics[other])
    async with open_client(c.daemons[other].address) as cl:
        await _first_append(cl, "dead/x", b" after")
        assert (await cl.read("dead/x", 0, 100)).data == b"before after"


@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_two_survivors_told_to_take_over_at_once_one_wins(
    cluster: ReplicatedCluster,
) -> None:
    """Right after kill -9 of node-c (before down_after), node-a and node-b are both
    told to take it over at the same moment (``cluster drain node-c --to`` each): one
    is answered OK and runs the container, the other is told who does; the container
    serves once, with its bytes, and nobody takes it over again later."""
    c = cluster
    async with open_client(c.daemons["node-c"].address) as cl:
        await cl.create("dead/x")
        await cl.append("dead/x", b"before")
    _kill(c, "node-c")
    answers: dict[str, str] = {}

    async def take_over(node: str) -> None:
        async with open_client(c.daemons[node].address) as cl:
            try:
                await cl.cluster(take_over="node-c")
                answers[node] = "ok"
            except GatewayError as e:
                answers[node] = str(e)

    async with trio.open_nursery() as nursery:
        for node in ("node-a", "node-b"):
            nursery.start_soon(take_over, node)
    print(answers)
    winners = [n for n, a in answers.items() if a == "ok"]
    assert len(winners) == 1, answers
    (winner,) = winners
    (loser,) = [n for n in answers if n != winner]
    assert f"node {winner} is already taking node node-c over" in answers[loser], answers
    host, address = await _wait_hosted(c, loser, "node-c")
    assert host == winner
    async with open_client(c.daemons[loser].address) as cl:
        await _first_append(cl, "dead/x", b" after")
    await trio.sleep(6)  # past down_after twice: the automatic path does not start another
    hosting = [n for n in answers if (c.daemons[n].data_dir / "hosted" / "node-c").exists()]
    assert hosting == [winner]
    assert not _TAKING.search(c.daemons[loser].log_path.read_text())
    async with open_client(address) as cl:
        assert (await cl.read("dead/x", 0, 100)).data == b"before after"


@pytest.mark.timeout(300)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_taken_over_container_fails_over_again_when_its_host_dies(
    cluster4: ReplicatedCluster,
) -> None:
    """Four nodes: kill -9 node-c, then kill -9 the node that took it over. node-c's
    container (and the host's own) fail over to the two nodes left, and every byte
    acknowledged to node-c, before the first kill and on its first host, is there;
    appends go on."""
    c = cluster4
    async with open_client(c.daemons["node-c"].address) as cl:
        await cl.create("dead/x", codec="lines")
        await cl.append("dead/x", b"on node-c\n")
    _kill(c, "node-c")
    first, _ = await _wait_hosted(c, "node-a", "node-c")
    left = [n for n in c.daemons if n not in ("node-c", first)]
    await _wait_hosted(c, left[0], "node-c")
    async with open_client(c.daemons[left[0]].address) as cl:
        await _first_append(cl, "dead/x", b"on the first host\n")
    async with open_client(c.daemons[first].address) as cl:
        await cl.create("host/own")
        await cl.append("host/own", b"the host's own")
    _kill(c, first)
    second, address = await _wait_hosted(c, left[0], "node-c", not_on=(first,), within=90)
    assert second in left
    # The first host's own container fails over too.
    host_of_first, _ = await _wait_hosted(c, left[0], first, within=90)
    assert host_of_first in left
    print(f"node-c: {first} then {second}; {first}: {host_of_first}")
    for via in left:
        async with open_client(c.daemons[via].address) as cl:

            async def appended(cl: object = cl, via: str = via) -> bool:
                try:
                    await cl.append("dead/x", f"via {via}\n".encode())  # type: ignore[attr-defined]
                except GatewayError:
                    return False
                return True

            await async_wait_for(appended, 60, f"an append to dead/x via {via}")
            acked = time.monotonic()
            mine = f"via {via}\n".encode()

            # Read back through the same node: its view of node-c shows only what was
            # flushed until it polled the new host, so this can lag the append; and
            # host/own, created just before its container moved, may not be in its
            # view yet (SEGMENT_NOT_FOUND until the next poll).
            async def read_back(cl: object = cl, mine: bytes = mine) -> bool:
                try:
                    data = (await cl.read("dead/x", 0, 1000)).data  # type: ignore[attr-defined]
                    own = (await cl.read("host/own", 0, 100)).data  # type: ignore[attr-defined]
                except SegmentNotFound:
                    return False
                return (
                    data.startswith(b"on node-c\non the first host\n")
                    and mine in data
                    and own == b"the host's own"
                )

            await async_wait_for(read_back, 30, f"dead/x and host/own read through {via}")
            print(f"read back through {via} {time.monotonic() - acked:.2f}s after the append")
    async with open_client(address) as cl:
        data = (await cl.read("dead/x", 0, 1000)).data
    # Once each (an append that failed may still have landed: at least once).
    assert data.count(b"on node-c\n") == data.count(b"on the first host\n") == 1, data
    assert all(f"via {via}\n".encode() in data for via in left), data


@pytest.mark.timeout(300)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_with_one_node_left_it_runs_both_dead_containers(cluster: ReplicatedCluster) -> None:
    """Three nodes: kill -9 node-c, then its host. The node left holds the only other
    copy of both dead containers' journals (a hosted container keeps none on its host's
    disk): it takes both over and every acknowledged byte reads back there. Alone it
    has no ack quorum (ack_quorum 2 needs one more node up): appends are answered
    NoQuorum, not acknowledged, until the dead host is started again; then they go on."""
    c = cluster
    async with open_client(c.daemons["node-c"].address) as cl:
        await cl.create("dead/x", codec="lines")
        await cl.append("dead/x", b"on node-c\n")
    _kill(c, "node-c")
    first, _ = await _wait_hosted(c, "node-a", "node-c")
    (last,) = [n for n in ("node-a", "node-b") if n != first]
    await _wait_hosted(c, last, "node-c")
    async with open_client(c.daemons[last].address) as cl:
        await _first_append(cl, "dead/x", b"on the first host\n")
    async with open_client(c.daemons[first].address) as cl:
        await cl.create("host/own")
        await cl.append("host/own", b"the host's own")
    _kill(c, first)
    killed = time.monotonic()
    second, c_address = await _wait_hosted(c, last, "node-c", not_on=(first,), within=90)
    host_of_first, first_address = await _wait_hosted(c, last, first, within=90)
    print(f"{last} runs node-c and {first} {time.monotonic() - killed:.1f}s after the kill")
    want = b"on node-c\non the first host\n"
    # On the new host itself at once, through the node left a little later (its view
    # of the other containers shows only what is flushed until it polled the new host).
    async with open_client(c_address) as cl:
        assert (await cl.read("dead/x", 0, 1000)).data == want
    async with open_client(first_address) as cl:
        assert (await cl.read("host/own", 0, 1000)).data == b"the host's own"
    t0 = time.monotonic()
    async with open_client(c.daemons[last].address) as cl:

        async def there() -> bool:
            return (await cl.read("dead/x", 0, 1000)).data == want and (
                await cl.read("host/own", 0, 100)
            ).data == b"the host's own"

        await async_wait_for(there, 30, f"both read through {last}")
    print(f"both read through {last} after {time.monotonic() - t0:.1f}s more")
    assert second == host_of_first == last
    async with open_client(c.daemons[last].address) as cl:
        with pytest.raises(NoQuorum):
            await cl.append(
                "dead/x", b"alone\n", expected_offset=len(b"on node-c\non the first host\n")
            )
    # The first host comes back (and takes its own container back): node-c's
    # container has a replica again and takes appends.
    await trio.to_thread.run_sync(lambda: c.daemons[first].start(timeout=120))
    async with open_client(c.daemons[last].address) as cl:

        async def appended() -> bool:
            try:
                await cl.append("dead/x", b"again\n")
            except (NoQuorum, OwnerDown):
                return False
            return True

        await async_wait_for(appended, 90, "an append to dead/x with a replica again")
        data = (await cl.read("dead/x", 0, 1000)).data
    # The refused append may have become durable once the replica came back (NoQuorum
    # says so); nothing else is there, nothing twice.
    assert data in (
        b"on node-c\non the first host\nagain\n",
        b"on node-c\non the first host\nalone\nagain\n",
    ), data
