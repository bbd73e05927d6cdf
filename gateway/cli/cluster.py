"""``cluster``: the nodes that share this node's Tier 2, as its registry sees them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.cli.common import Commands, add_command, run_client


def _cmd_cluster(args: argparse.Namespace) -> int:
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
                    "ensemble": list(n.ensemble),
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
            print(f"{n.id + me:<20} {n.state:<8} {n.advertise:<22} {n.segments:>9} "
                  f"{n.unflushed_bytes:>12} {age:>9.1f}s {n.epoch:>6}  {replicas}")  # fmt: skip
        for n in nodes:
            if n.self and n.replicas_of:
                print(f"{n.id} holds replicas of: {', '.join(n.replicas_of)}")
        down = [n.id for n in nodes if n.state == "down"]
        return 1 if down else 0

    return run_client(args, run)


def register(sub: Commands) -> None:
    """Add ``cluster``."""
    p = add_command(sub, "cluster", _cmd_cluster, "list the nodes sharing this node's Tier 2: "
                    "state, segments, unflushed bytes, heartbeat age (exit 1 if one is down)",
                    client=True)  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per node")
