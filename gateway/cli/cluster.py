"""``cluster``: the nodes that share this node's Tier 2, as its registry sees them.

``cluster drain NODE [--to TARGET]`` moves a live node's container to another
node (`gateway.cluster.handover`) and waits until it serves there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gateway.cli.common import Commands, add_command, connect_settings, run_client, tls_options
from gateway.errors import BadRequest, Unavailable
from gateway.progress import Progress, shown


def _cmd_cluster(args: argparse.Namespace) -> int:
    if args.action == "drain":
        return _drain(args)
    if args.action == "forget":
        return _forget(args)
    if args.action is not None or args.node is not None:
        raise BadRequest("usage: cluster [--json] | cluster drain NODE [--to TARGET] | "
                         "cluster forget NODE")  # fmt: skip

    async def run(client: Any) -> int:
        nodes = await client.cluster()
        if args.json:
            for n in nodes:
                print(json.dumps({
                    "id": n.id, "advertise": n.advertise, "state": n.state, "epoch": n.epoch,
                    "version": n.version, "segments": n.segments,
                    "unflushed_bytes": n.unflushed_bytes,
                    "heartbeat_age_s": n.heartbeat_age_ms / 1000,
                    "started_at_ms": n.started_at_ms, "self": n.self,
                    "ensemble": list(n.ensemble), "hosted_by": n.hosted_by,
                    **({"quorum": n.quorum, "replicas_of": list(n.replicas_of)} if n.self else {}),
                }))  # fmt: skip
            return 0
        print(f"{'NODE':<20} {'STATE':<8} {'ADDRESS':<22} {'SEGMENTS':>9} "
              f"{'UNFLUSHED':>12} {'HEARTBEAT':>10} {'EPOCH':>6}  REPLICATED TO")  # fmt: skip
        for n in nodes:
            me = " *" if n.self else ""
            age = n.heartbeat_age_ms / 1000
            replicas = ",".join(n.ensemble) or "-"
            if n.self and n.ensemble and not n.quorum:
                replicas += " (NO QUORUM)"
            if n.hosted_by:
                replicas += f"  [runs on {n.hosted_by}]"
            print(f"{n.id + me:<20} {n.state:<8} {n.advertise:<22} {n.segments:>9} "
                  f"{n.unflushed_bytes:>12} {age:>9.1f}s {n.epoch:>6}  {replicas}")  # fmt: skip
        for n in nodes:
            if n.self and n.replicas_of:
                print(f"{n.id} holds replicas of: {', '.join(n.replicas_of)}")
        down = [n.id for n in nodes if n.state == "down"]
        return 1 if down else 0

    return run_client(args, run)


def _drain(args: argparse.Namespace) -> int:
    """Move NODE's container to TARGET (default: the first in line for it); wait until it serves."""
    import trio

    from gateway.client.client import open_client
    from gateway.cluster.failover import rank

    node = args.node
    if not node:
        raise BadRequest("cluster drain: name the node to drain")
    address, token = connect_settings(args)
    tls = tls_options(args)

    def say(text: str) -> None:
        print(f"{time.monotonic() - began:6.1f}s  {text}", file=sys.stderr, flush=True)

    async def main() -> int:
        async with open_client(address, token, **tls) as client:
            nodes = {n.id: n for n in await client.cluster()}
        if node not in nodes:
            raise BadRequest(f"node {node} is not in the registry")
        before = nodes[node]
        target = args.to
        if not target:
            up = [n.id for n in nodes.values() if n.state == "up" and not n.hosted_by
                  and n.id != node and n.id != before.hosted_by]  # fmt: skip
            if not up:
                raise Unavailable(f"no other node is up to take node {node}'s container")
            target = rank(node, up)[0]
        if target not in nodes:
            raise BadRequest(f"node {target} is not in the registry")
        say(f"draining node {node} (epoch {before.epoch}) to node {target}")
        async with open_client(nodes[target].advertise, token, **tls) as client:
            await client.cluster(take_over=node)
            say(f"node {target} claimed it; waiting for node {node} to stop and for it to "
                "serve there")  # fmt: skip
            # The time it takes, and where the container is meanwhile (a terminal only).
            bar = Progress(f"drain {node}", unit="", show=shown(args.quiet))
            with bar, trio.fail_after(args.timeout):
                while True:
                    now = {n.id: n for n in await client.cluster()}.get(node)
                    if now is not None:
                        where = f"on {now.hosted_by}" if now.hosted_by else "on its own host"
                        bar.describe(f"drain {node}: {now.state} {where}, epoch {now.epoch}")
                    bar.refresh()
                    if (
                        now is not None
                        and now.hosted_by == target
                        and now.state == "up"
                        and now.epoch > before.epoch
                    ):
                        break
                    await trio.sleep(0.2)
        say(f"node {node}'s container serves on node {target} at {now.advertise}")
        return 0

    began = time.monotonic()
    try:
        return trio.run(main)
    except trio.TooSlowError:
        why = f"node {node}'s container did not serve elsewhere within {args.timeout:g}s"
        raise Unavailable(f"{why}; see `segment-gateway cluster`") from None


def _forget(args: argparse.Namespace) -> int:
    """Retire NODE for good (asked of the connected node)."""
    if not args.node:
        raise BadRequest("cluster forget: name the node to retire")

    async def run(client: Any) -> int:
        nodes = {n.id: n for n in await client.cluster(forget=args.node)}
        n = nodes.get(args.node)
        if n is not None and n.hosted_by:
            print(f"node {args.node} retired; its container stays on node {n.hosted_by}")
        else:
            print(f"node {args.node} retired and removed from the registry")
        return 0

    return run_client(args, run)


def register(sub: Commands) -> None:
    """Add ``cluster``."""
    p = add_command(sub, "cluster", _cmd_cluster, "list the nodes sharing this node's Tier 2: "
                    "state, segments, unflushed bytes, heartbeat age (exit 1 if one is down); "
                    "`cluster drain NODE` moves a live node's container to another node, "
                    "`cluster forget NODE` retires a drained or dead one",
                    client=True, progress=True)  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per node")
    p.add_argument("action", nargs="?", choices=["drain", "forget"],
                   help="drain: move NODE's container to another node (it stops cleanly; "
                   "start it again to take it back); forget: retire NODE for good (a drained "
                   "or dead node; its container, if any, stays where it runs)")  # fmt: skip
    p.add_argument("node", nargs="?", metavar="NODE", help="the node to drain or forget")
    p.add_argument("--to", metavar="NODE", default="",
                   help="the node to drain to (default: the first in line for it)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="give up waiting after this long (default 300)")  # fmt: skip
