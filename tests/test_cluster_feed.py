"""Two nodes on one SeaweedFS bucket: node-a's mount follows node-b by its change feed.

Every kind of change on node-b shows in node-a's mount; a restarted node-b
is listed once in full, then followed again; and what following costs --
the requests node-a sends node-b while one segment changes -- is the same
with 10 and with 2,000 unchanged segments (no listing, no record fetches).
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator

import pytest
import trio

from gateway.client.client import open_client
from gateway.embedded import EmbeddedS3
from tests.helpers.cluster import Cluster
from tests.helpers.daemon import scrape
from tests.helpers.mount import require_fuse
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

A, B = "node-a", "node-b"


@pytest.fixture(scope="module")
def cluster(seaweedfs: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_fuse()
    c = Cluster(tmp_path_factory.mktemp("feed"), seaweedfs, nodes=(A, B))
    try:
        c.start()
        yield c
    finally:
        c.teardown()


def follow_counts(cluster: Cluster) -> dict[str, float]:
    """What node-a sent node-b following it, by kind, and the records the feed brought."""
    m = scrape(cluster.daemons[A].metrics_port)
    out = {
        kind: m.get(f'segment_gateway_cluster_follow_requests_total{{kind="{kind}",node="{B}"}}', 0)
        for kind in ("list", "get_record", "changes", "walk")
    }
    out["records"] = m.get(f'segment_gateway_cluster_follow_feed_records_total{{node="{B}"}}', 0)
    return out


def served(cluster: Cluster, kind: str) -> float:
    """Requests of ``kind`` node-b took since it started."""
    m = scrape(cluster.daemons[B].metrics_port)
    return m.get(f'segment_gateway_requests_total{{kind="{kind}"}}', 0)


def shows(path: pathlib.Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False


def test_a_follower_sees_every_change_through_its_mount(cluster: Cluster) -> None:
    mnt = cluster.daemons[A].mnt
    wait_for(lambda: follow_counts(cluster)["changes"] > 2, 10, "node-a following node-b's feed")
    before = follow_counts(cluster)
    with cluster.client(B) as b:
        b.create("fd/x")
        b.append("fd/x", b"hello ")
        wait_for(lambda: shows(mnt / "fd/x", b"hello "), 5, "a create and an append")
        b.append("fd/x", b"world")
        wait_for(lambda: shows(mnt / "fd/x", b"hello world"), 5, "an append")
        b.seal("fd/x")
        wait_for(lambda: os.getxattr(mnt / "fd/x", "user.segment.sealed") == b"1", 5, "a seal")
        assert (mnt / "fd/x").read_bytes() == b"hello world"
        b.create("fd/t")
        b.append("fd/t", b"t" * 100)
        b.truncate("fd/t", 40)
        wait_for(
            lambda: os.getxattr(mnt / "fd/t", "user.segment.start_offset") == b"40", 5, "a truncate"
        )
        assert (mnt / "fd/t").read_bytes() == bytes(40) + b"t" * 60
        b.delete("fd/t")
        wait_for(lambda: not (mnt / "fd/t").exists(), 5, "a delete")
        b.create("fd/again")
        b.append("fd/again", b"first")
        wait_for(lambda: shows(mnt / "fd/again", b"first"), 5, "the first of a name")
        first = (mnt / "fd/again").stat().st_ino
        b.delete("fd/again")
        b.create("fd/again")
        b.append("fd/again", b"second!")
        wait_for(lambda: shows(mnt / "fd/again", b"second!"), 5, "a name deleted and created")
        assert (mnt / "fd/again").stat().st_ino != first
        b.create_stream("fd-stream")
        wait_for((mnt / "fd-stream").is_dir, 5, "a stream's directory")
        b.delete_stream("fd-stream")
        wait_for(lambda: not (mnt / "fd-stream").exists(), 5, "a stream deleted")
    after = follow_counts(cluster)
    # All of it through the feed: no listing, no record fetched.
    assert after["list"] == before["list"] and after["get_record"] == before["get_record"]
    assert after["changes"] > before["changes"] and after["records"] > before["records"]


def test_a_restarted_owner_is_walked_once_then_followed(cluster: Cluster) -> None:
    mnt = cluster.daemons[A].mnt
    with cluster.client(B) as b:
        b.create("rs/kept")
        b.append("rs/kept", b"before the restart")
        b.create("rs/gone")
    wait_for(lambda: shows(mnt / "rs/kept", b"before the restart"), 5, "rs/kept on node-a")
    before = follow_counts(cluster)
    d = cluster.daemons[B]
    d.stop()
    d.start(timeout=60)
    with cluster.client(B) as b:
        b.delete("rs/gone")
        b.create("rs/new")
        b.append("rs/new", b"after it")
    wait_for(lambda: shows(mnt / "rs/new", b"after it"), 15, "rs/new on node-a")
    wait_for(lambda: not (mnt / "rs/gone").exists(), 5, "rs/gone gone from node-a")
    assert (mnt / "rs/kept").read_bytes() == b"before the restart"
    # The new process: walked in full, one page (once per connection to it: the
    # first may be made before its registry record names it, and is made again);
    # never listed.
    counts = follow_counts(cluster)
    assert 1 <= counts["walk"] - before["walk"] <= 2 and counts["list"] == before["list"]
    assert served(cluster, "list") == 0
    with cluster.client(B) as b:
        b.append("rs/new", b", and more")
    wait_for(lambda: shows(mnt / "rs/new", b"after it, and more"), 5, "an append after")
    assert follow_counts(cluster)["walk"] == counts["walk"]  # followed by its feed again


async def _create_many(address: str, prefix: str, first: int, end: int) -> None:
    """Segments ``prefix/first`` to ``prefix/end - 1``, 32 creates in flight."""
    async with open_client(address) as client:

        async def some(start: int) -> None:
            for i in range(start, end, 32):
                await client.create(f"{prefix}/{i:05}")

        async with trio.open_nursery() as nursery:
            for start in range(first, first + 32):
                nursery.start_soon(some, start)


def _cost_of_changes(cluster: Cluster, name: str, appends: int) -> dict[str, float]:
    """What node-a asked of node-b while ``appends`` appends to ``name`` showed, one by one."""
    mnt = cluster.daemons[A].mnt
    before = follow_counts(cluster)
    served_before = {k: served(cluster, k) for k in ("list", "get_record", "changes")}
    started = time.monotonic()
    with cluster.client(B) as b:
        data = b""
        for i in range(appends):
            piece = f"{i}\n".encode()
            b.append(name, piece)
            data += piece
            wait_for(
                lambda: shows(mnt / name, data),
                5,
                f"append {i} of {name}",
                detail=lambda: f"{follow_counts(cluster)} {(mnt / name).stat()}",
            )
    seconds = time.monotonic() - started
    after = follow_counts(cluster)
    cost = {k: after[k] - before[k] for k in after}
    cost.update({f"served {k}": served(cluster, k) - n for k, n in served_before.items()})
    cost["changes per second"] = cost["changes"] / seconds
    return cost


def test_following_costs_the_same_with_10_and_2000_unchanged_segments(cluster: Cluster) -> None:
    mnt = cluster.daemons[A].mnt
    address = cluster.daemons[B].address
    trio.run(_create_many, address, "cost", 0, 10)
    wait_for(lambda: len(os.listdir(mnt / "cost")) == 10, 10, "10 segments on node-a")
    few = _cost_of_changes(cluster, "cost/00003", 5)
    trio.run(_create_many, address, "cost", 10, 2000)
    wait_for(lambda: len(os.listdir(mnt / "cost")) == 2000, 60, "2,000 segments on node-a")
    many = _cost_of_changes(cluster, "cost/00007", 5)
    print("following node-b, 10 segments:", few)
    print("following node-b, 2,000 segments:", many)
    for cost in (few, many):
        assert cost["list"] == cost["get_record"] == 0
        assert cost["served list"] == cost["served get_record"] == 0
        assert cost["records"] == 5  # the changed segment, once per append
        # (the two nodes' counters are read a moment apart)
        assert abs(cost["changes"] - cost["served changes"]) <= 2
    # The same requests per second (a refresh every 0.25 s), whatever is unchanged.
    assert many["changes per second"] < 2 * few["changes per second"] + 4
