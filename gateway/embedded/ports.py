"""The eight loopback ports of one SeaweedFS instance: chosen, checked, remembered.

Every component of ``weed server`` listens on an HTTP port and a gRPC port
(by default the HTTP port + 10000). We pick all eight explicitly, below the
kernel's ephemeral range so that outgoing connections cannot take them while
the server is down, and remember them in ``<data_dir>/embedded-s3.json``: the
master keeps its state in ``m<port>/``, so the same ports mean the same state
after a restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import random
import socket
from dataclasses import asdict, dataclass

from gateway.embedded.errors import EmbeddedS3Error
from gateway.embedded.files import write_atomically

__all__ = [
    "HOST",
    "PORTS_FILE",
    "Ports",
    "choose_ports",
    "load_ports",
    "port_free",
    "remove_sockets",
    "save_ports",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Where the chosen ports are remembered between runs.
PORTS_FILE = "embedded-s3.json"
#: Lowest port we pick; SeaweedFS's own defaults (8080, 8333, 8888, 9333...) lie below.
_LOWEST_PORT = 10000


@dataclass(frozen=True)
class Ports:
    """The eight ports of one SeaweedFS instance (all on 127.0.0.1)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    def all(self) -> list[int]:
        """Every port, in field order."""
        return list(asdict(self).values())


def port_free(port: int) -> bool:
    """Whether a ``weed`` listener could take ``port`` on loopback now.

    Free: nothing listens on it, and no Unix socket named after it is left
    in /tmp that this user cannot remove (see `_stale_sockets_cleared`).
    """
    if not 0 < port <= 65535:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As Go's listeners do: connections of a killed server linger in
        # TIME_WAIT on its ports, which must not count as "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return _stale_sockets_cleared(port)


def _stale_sockets_cleared(port: int) -> bool:
    """Remove the sockets a killed ``weed`` left for ``port``; False if one is not ours.

    Each ``weed`` listener also listens on /tmp/seaweedfs-<component>-<port>.sock
    and removes an old file of that name first. It cannot remove another
    user's (/tmp is sticky): it logs "bind: address already in use", that
    listener never serves, and the server never stores data (seen when a
    daemon running as the service user drew a port whose socket a root
    daemon, SIGKILLed earlier, had left). Nothing listens on the TCP port,
    so a socket named after it is stale.
    """
    for path in pathlib.Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """First port of the kernel's range for outgoing connections."""
    try:
        text = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` distinct free loopback ports below the ephemeral range, not in ``taken``."""
    high = max(_ephemeral_low(), _LOWEST_PORT + 1000)
    rng = random.Random()  # not the global one: tests seed that
    picked: list[int] = []
    for _ in range(10_000):
        port = rng.randrange(_LOWEST_PORT, high)
        if port not in taken and port not in picked and port_free(port):
            picked.append(port)
            if len(picked) == count:
                return picked
    raise EmbeddedS3Error(f"found no {count} free ports on {HOST} between {_LOWEST_PORT}-{high}")


def choose_ports(
    data_dir: pathlib.Path, current: Ports | None, port: int, same_ports: bool = False
) -> Ports:
    """The ports of the last run if they are free (same master state), else new ones.

    ``current``: the ports of this server object's last start, if any;
    ``port``: the S3 port asked for (0: any). With ``same_ports``, the
    current ports or an `EmbeddedS3Error` naming the taken one.
    """
    if same_ports and current is not None:
        for name, p in asdict(current).items():
            if not port_free(p):
                raise EmbeddedS3Error(
                    f"port {p} on {HOST} ({name.replace('_', ' ')}) is in use; "
                    "cannot restart on the ports its clients know"
                )
        return current
    remembered = current or load_ports(data_dir)
    if port:
        wanted = {"s3": port, "s3_grpc": port + 10000}
        for name, p in wanted.items():
            if not port_free(p):
                raise EmbeddedS3Error(
                    f"port {p} on {HOST} ({name.replace('_', ' ')}) is in use; "
                    "choose another [tier2] embedded_port, or 0 for a free one"
                )
        if remembered is not None and remembered.s3 == port:
            others = [p for p in remembered.all()[:6] if port_free(p)]
            if len(others) == 6:
                return remembered
        m, mg, v, vg, f, fg = pick_ports(6, set(wanted.values()))
        return Ports(m, mg, v, vg, f, fg, s3=port, s3_grpc=port + 10000)
    if remembered is not None and all(port_free(p) for p in remembered.all()):
        return remembered
    if remembered is not None:
        log.warning(
            "ports %s of the last SeaweedFS run are not all free; choosing new ones",
            remembered.all(),
        )
    m, mg, v, vg, f, fg, s, sg = pick_ports(8, set())
    return Ports(m, mg, v, vg, f, fg, s, sg)


def load_ports(data_dir: pathlib.Path) -> Ports | None:
    """The ports remembered in ``data_dir``, or None (none, or unreadable: a warning)."""
    path = data_dir / PORTS_FILE
    try:
        saved = json.loads(path.read_text())
        return Ports(**{k: int(v) for k, v in saved["ports"].items()})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return None


def save_ports(data_dir: pathlib.Path, ports: Ports) -> None:
    """Remember ``ports`` in ``data_dir`` for the next start."""
    # "ports": the eight ports of the last successful start, by component.
    write_atomically(
        data_dir / PORTS_FILE,
        json.dumps({"version": 1, "ports": asdict(ports)}, indent=2) + "\n",
    )


def remove_sockets(ports: Ports) -> None:
    """Remove the Unix sockets weed leaves in /tmp, named after its ports."""
    # /tmp/seaweedfs-<component>[-grpc]-<port>.sock, one per listener.
    for port in ports.all():
        for path in pathlib.Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                path.unlink()
