"""A container hosted on another node's host: ``python -m gateway.cli.hosted DIR``.

Started by `gateway.cluster.failover.ContainerHost` with the directory it
prepared: ``DIR/hosted.json`` holds the configuration (the host's, with the
hosted node's id, this directory as its data directory, a port of its own,
no mount, and metrics on a loopback port of its own, whose address it writes
to ``DIR/metrics.address`` for the host's /metrics), the host's node id, where the host keeps
its replica logs (the recovery copies what they hold of this node's journal
from there) and, for a takeover, the epoch that died. The process is an
ordinary ``serve``: the same recovery, lease, replication, storage writer
and streams as on the node's own host. It writes ``DIR/ready`` (HOST:PORT)
once it serves.
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys

from gateway import logs
from gateway.config import Config
from gateway.errors import GatewayError

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    """Run the hosted container described in ``argv[0]``; the process's exit code."""
    import trio

    from gateway.cluster.failover import READY_FILE, SPEC_FILE
    from gateway.daemon import Hosting, run_daemon

    directory = pathlib.Path(argv[0])
    spec = json.loads((directory / SPEC_FILE).read_text())
    config = Config.from_dict(spec["config"], source=str(directory / SPEC_FILE))
    logs.setup(config.logging.level.upper(), prefix=f"[{config.node.id} on {spec['hosted_by']}] ")
    logs.REDACT.add(config.server.token)
    takeover_of = spec.get("takeover_of")
    hosting = Hosting(
        host=spec["hosted_by"],
        advertise_host=spec.get("advertise_host", ""),
        takeover_of=takeover_of,
        replicas=spec.get("replicas", ""),
    )
    try:
        trio.run(
            run_daemon,
            config,
            directory / READY_FILE,
            None,
            None,
            takeover_of is not None,
            hosting,
        )
    except GatewayError as e:
        from gateway.cluster.failover import FENCED_EXITS

        # Fenced: another process holds the node id, which the host expects.
        (log.warning if e.exit_code in FENCED_EXITS else log.error)("%s", e)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
