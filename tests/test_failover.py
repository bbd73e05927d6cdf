"""Containers that fail over: a dead node's segments keep taking appends on a survivor.

Three replicating daemons on one SeaweedFS bucket (``write_quorum = 3,
ack_quorum = 2``, ``cluster.takeover = true``, ``down_after = 3s``,
``lease = 2s``). Killing one with SIGKILL makes a survivor run its
container (`gateway.cluster.failover`): writers that went through any node
continue, and every node's mount shows every acknowledged event once.
"""

from __future__ import annotations

import itertools
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from gateway.client.client import open_client
from gateway.client.writer import open_segment_writer
from gateway.cluster.failover import claim_takeover, rank, takeover_key
from gateway.embedded import EmbeddedS3
from gateway.storage.layer import ChunkLayer
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import node_config
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.mount import force_unmount, require_fuse
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.wait import async_wait_for, wait_for
from tests.torture import check_lines

#: cluster.down_after in the test cluster; the issue's bound is this + 10 s.
DOWN_AFTER = 3.0


def test_rank_is_the_same_everywhere_and_spreads_dead_nodes() -> None:
    nodes = [f"node-{i}" for i in range(5)]
    assert rank("node-x", nodes) == rank("node-x", list(reversed(nodes)))
    firsts = {rank(f"dead-{i}", nodes)[0] for i in range(40)}
    assert len(firsts) >= 4  # not always the same survivor


async def test_of_many_racing_claims_exactly_one_wins(s3_storage: S3Storage) -> None:
    layer = ChunkLayer(s3_storage)
    winners: list[str] = []

    async def claim(host: str) -> None:
        c = await claim_takeover(layer, "node-dead", 7, host)
        winners.append(c.host)

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(claim, f"node-{i}")
    # Everyone learns the same winner, and it is one of the claimants.
    assert len(set(winners)) == 1 and winners[0].startswith("node-")
    stored = await layer.read(takeover_key("node-dead", 7), 0, 4096)
    assert winners[0].encode() in stored
    # The next epoch is a new race.
    again = await claim_takeover(layer, "node-dead", 8, "node-late")
    assert again.host == "node-late"


@pytest.fixture
def cluster(tmp_path: pathlib.Path, seaweedfs: EmbeddedS3) -> Iterator[ReplicatedCluster]:
    require_fuse()
    c = ReplicatedCluster(tmp_path, seaweedfs, mounts=True, takeover=True)
    try:
        c.start()
        yield c
    finally:
        c.teardown()


EXPECTED_ERRORS = (
    "cluster: .*", "replication: .*", "connection .*", "failover: .*", "recovery: .*",
    "handover: .*", "handback: .*",
)  # fmt: skip


def _event(i: int) -> bytes:
    return b"event-%08d" % i


async def _all_there(c: ReplicatedCluster, nodes: tuple[str, ...], events: int) -> None:
    """Every event once and in order, over the protocol and through the mount of each node."""
    for node in nodes:
        d = c.daemons[node]

        async def by_protocol(d: Any = d, node: str = node) -> bool:
            async with open_client(d.address) as cl:
                info = await cl.info("dead/events")
                data = (await cl.read("dead/events", 0, info.length)).data
            where = f"over the protocol via {node}"
            return check_lines(data, _event, 0, where, "dead/events") == events

        await async_wait_for(by_protocol, 30, f"dead/events over the protocol via {node}")

        def through_mount(d: Any = d, node: str = node) -> bool:
            data = (d.mnt / "dead" / "events").read_bytes()
            return check_lines(data, _event, 0, f"through {node}'s mount", "dead/events") == (
                events
            )

        await trio.to_thread.run_sync(
            lambda f=through_mount, n=node: wait_for(f, 30, f"{n}'s mount")
        )


async def _fsck_clean(c: ReplicatedCluster, nodes: tuple[str, ...]) -> None:
    """Online fsck through each node finds nothing (chunks, attribute index, orphans)."""
    for node in nodes:
        address = c.daemons[node].address
        r = await trio.to_thread.run_sync(
            lambda a=address: run_cli("fsck", "--connect", a, timeout=120)
        )
        assert r.returncode == 0, f"fsck via {node}:\n{r.stdout}\n{r.stderr}"


async def _hosted_by(c: ReplicatedCluster, via: str, node: str) -> str:
    async with open_client(c.daemons[via].address) as cl:
        status = {n.id: n for n in await cl.cluster()}
    return status[node].hosted_by


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_killed_node_is_taken_over_and_gets_its_container_back(
    cluster: ReplicatedCluster,
) -> None:
    """kill -9 of a node while an exactly-once writer appends to its segment through
    another node: appends succeed again within down_after + 10 s, on a survivor that
    runs the dead node's container. The node then comes back with its old journal and
    takes its container back (handback) while the writer goes on. Every acknowledged
    event is there once, in order, over the protocol and through every node's mount."""
    c = cluster
    a, dead = c.daemons["node-a"], c.daemons["node-c"]
    async with open_client(dead.address) as cl:
        await cl.create("dead/events", codec="lines")
    events = 4500
    killed_at: list[float] = []
    flushed_at: list[float] = []
    back = trio.Event()

    hosts: list[str] = []

    async def come_back() -> None:
        # Once the takeover serves: the node returns with its old journal.
        async def hosted() -> bool:
            host = await _hosted_by(c, "node-a", "node-c")
            hosts.append(host)
            return bool(host)

        await async_wait_for(hosted, 60, "node-c's container hosted")
        assert hosts[-1] in ("node-a", "node-b")
        # hosted_by is registered as the takeover begins; the host logs once it serves.
        host_log = c.daemons[hosts[-1]].log_path
        await trio.to_thread.run_sync(
            lambda: wait_for(lambda: "took over in" in host_log.read_text(), 60, "took over in")
        )
        await trio.to_thread.run_sync(lambda: dead.start(timeout=120))
        back.set()

    async with trio.open_nursery() as nursery, open_segment_writer(
        a.address, "dead/events", codec="lines", writer_id=uuid.uuid4().bytes,
        max_batch_bytes=2048, reconnect_timeout=120,
    ) as w:  # fmt: skip
        for i in range(events):
            await w.write(_event(i))
            if i % 25 == 0:
                await w.flush()
                flushed_at.append(time.monotonic())
                await trio.sleep(0.005)
            if i == events // 3:
                await w.flush()

                def crash() -> None:
                    dead.kill()
                    force_unmount(dead.mnt)

                await trio.to_thread.run_sync(crash)
                killed_at.append(time.monotonic())
                nursery.start_soon(come_back)
            if i > 2 * events // 3 and not back.is_set():
                await back.wait()  # the rest is written after the handback
        await w.flush()
        assert w.acked_event == events
    pause = min(t for t in flushed_at if t > killed_at[0]) - killed_at[0]
    print(f"first acknowledged append {pause:.1f}s after kill -9 (down_after {DOWN_AFTER:g}s)")
    assert pause <= DOWN_AFTER + 10, f"appends resumed {pause:.1f}s after the kill"

    # Back home: nobody hosts it, the stale journal was set aside, not replayed.
    await async_wait_for(lambda: _is_home(c, "node-c"), 30, "node-c's container back on node-c")
    assert (dead.data_dir / "journal.replaced").is_dir()
    assert "handed over" in (a.log_path.read_text() + c.daemons["node-b"].log_path.read_text())
    await _all_there(c, ("node-a", "node-b", "node-c"), events)


async def _is_home(c: ReplicatedCluster, node: str) -> bool:
    return await _hosted_by(c, "node-a", node) == "" and not any(
        (d.data_dir / "hosted" / node).exists() for d in c.daemons.values()
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_drain_under_load_fails_no_append_and_pauses_briefly(
    cluster: ReplicatedCluster,
) -> None:
    """``cluster drain`` moves a live node's container while an exactly-once writer
    appends to it: no append fails, the longest pause between acknowledgements is
    bounded, the drained node exits 0, and starting it again takes its container back."""
    c = cluster
    a, drained = c.daemons["node-a"], c.daemons["node-c"]
    async with open_client(drained.address) as cl:
        await cl.create("dead/events", codec="lines")
    events = 4000
    acked_at: list[float] = []
    drain_result: list[Any] = []

    async def drain() -> None:
        r = await trio.to_thread.run_sync(
            lambda: run_cli(
                "cluster", "drain", "node-c", "--to", "node-b", "--connect", a.address, timeout=120
            )
        )
        drain_result.append(r)

    async with trio.open_nursery() as nursery, open_segment_writer(
        a.address, "dead/events", codec="lines", writer_id=uuid.uuid4().bytes,
        max_batch_bytes=2048, reconnect_timeout=120,
    ) as w:  # fmt: skip
        for i in range(events):
            await w.write(_event(i))
            if i % 10 == 0:
                await w.flush()
                acked_at.append(time.monotonic())
                await trio.sleep(0.005)
            if i == events // 4:
                nursery.start_soon(drain)
            if i == events // 2:
                while not drain_result:
                    await w.flush()
                    acked_at.append(time.monotonic())
                    await trio.sleep(0.05)
        await w.flush()
        assert w.acked_event == events
    r = drain_result[0]
    assert r.returncode == 0, r.stderr
    assert "serves on node node-b" in r.stderr
    longest = max(b - a for a, b in itertools.pairwise(acked_at))
    print(f"drain: longest pause between acknowledgements {longest:.2f}s\n{r.stderr}")
    assert longest <= DRAIN_PAUSE, f"writers paused {longest:.2f}s"
    assert await _hosted_by(c, "node-a", "node-c") == "node-b"
    # The drained process stopped by itself, cleanly.
    assert await trio.to_thread.run_sync(lambda: _exit_code(drained)) == 0
    await _all_there(c, ("node-a", "node-b"), events)
    # Started again (an upgrade, say): it takes its container back.
    await trio.to_thread.run_sync(lambda: drained.start(timeout=120))
    await async_wait_for(lambda: _is_home(c, "node-c"), 60, "node-c's container back")
    await _all_there(c, ("node-a", "node-b", "node-c"), events)
    async with open_client(drained.address) as cl:
        await cl.flush()
    await _fsck_clean(c, ("node-a", "node-b", "node-c"))


#: The longest a writer may wait during a drain (the issue's target is 2 s).
DRAIN_PAUSE = 5.0


def _exit_code(d: Any) -> int | None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code = d.proc.poll()
        if code is not None:
            return int(code)
        time.sleep(0.1)
    return None


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_cluster_forget_retires_a_drained_or_empty_dead_node_for_good(
    cluster: ReplicatedCluster,
) -> None:
    """``cluster forget`` refuses a node that is up; retires a drained node (its
    container stays where it runs, the node no longer starts); removes an empty dead
    node from the registry."""
    c = cluster
    a, b, drained = c.daemons["node-a"], c.daemons["node-b"], c.daemons["node-c"]
    async with open_client(drained.address) as cl:
        await cl.create("kept/events", codec="lines")
        await cl.append("kept/events", b"one\n")

    def cli(*args: str) -> Any:
        return run_cli("cluster", *args, "--connect", a.address, timeout=120)

    r = await trio.to_thread.run_sync(lambda: cli("forget", "node-c"))
    assert r.returncode == 22 and "is up: drain it first" in r.stderr, r.stderr
    r = await trio.to_thread.run_sync(lambda: cli("drain", "node-c", "--to", "node-b"))
    assert r.returncode == 0, r.stderr
    assert await trio.to_thread.run_sync(lambda: _exit_code(drained)) == 0
    r = await trio.to_thread.run_sync(lambda: cli("forget", "node-c"))
    assert r.returncode == 0, r.stderr
    assert "its container stays on node node-b" in r.stdout
    # The container keeps serving where it runs; the node may not come back.
    async with open_client(a.address) as cl:
        await cl.append("kept/events", b"two\n")
        assert (await cl.read("kept/events", 0, 8)).data == b"one\ntwo\n"
    r = await trio.to_thread.run_sync(
        lambda: run_cli(
            "--config", str(drained.data_dir / "gateway.toml"), "serve", timeout=60, env=c.env
        )
    )
    assert r.returncode == 31 and "retired" in r.stderr, r.stderr[-2000:]
    # A stopped node that holds nothing: gone from the registry, nobody follows it.
    z = Daemon(c.root / "node-z", node_config("node-z", c.bucket, c.s3.endpoint_url), env=c.env)
    await trio.to_thread.run_sync(lambda: z.start(timeout=60))
    await async_wait_for(lambda: _listed(c, "node-z"), 30, "node-z in the registry")
    await trio.to_thread.run_sync(lambda: z.stop(timeout=30))
    await async_wait_for(lambda: _state(c, "node-z", "stopped"), 30, "node-z seen stopped")
    r = await trio.to_thread.run_sync(lambda: cli("forget", "node-z"))
    assert r.returncode == 0, r.stderr
    assert "removed from the registry" in r.stdout
    await async_wait_for(lambda: _not_listed(c, "node-z"), 30, "node-z gone from node-a's registry")
    await trio.to_thread.run_sync(
        lambda: wait_for(
            lambda: "node node-z left the registry" in b.log_path.read_text(), 30,
            "node-b to stop following node-z",
        )
    )  # fmt: skip


async def _listed(c: ReplicatedCluster, node: str) -> bool:
    async with open_client(c.daemons["node-a"].address) as cl:
        return node in {n.id for n in await cl.cluster()}


async def _state(c: ReplicatedCluster, node: str, state: str) -> bool:
    async with open_client(c.daemons["node-a"].address) as cl:
        return any(n.id == node and n.state == state for n in await cl.cluster())


async def _not_listed(c: ReplicatedCluster, node: str) -> bool:
    return not await _listed(c, node)
