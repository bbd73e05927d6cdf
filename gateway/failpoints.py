"""Failpoints: named places where a test can make the daemon crash on purpose.

Crash-safety tests must kill a real daemon at an exact point (say, between
a chunk upload and its journal record), which no timing from outside can
hit reliably. ``SEGMENT_GATEWAY_FAILPOINTS="name=action,..."`` in the
daemon's environment arms them. Actions: ``kill`` (SIGKILL the process
itself, like a power cut for everything not yet fdatasync'ed) and ``stall``
(block the calling thread -- the event loop -- for an hour, as a deadlocked
loop would; the test kills the daemon).
Unset -- always, outside tests -- `hit` is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

ENV = "SEGMENT_GATEWAY_FAILPOINTS"

#: Known failpoints and where they are.
KNOWN = {
    "after_chunk_upload": "a chunk is in Tier 2, its ChunkAdded not yet journaled",
    "watchdog_ping_5": "the fifth systemd watchdog ping has been sent",
}
ACTIONS = ("kill", "stall")


def _parse(text: str) -> dict[str, str]:
    armed = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, action = item.partition("=")
        if name not in KNOWN or action not in ACTIONS:
            raise ValueError(f"{ENV}: unknown failpoint or action {item!r}")
        armed[name] = action
    return armed


_ARMED = _parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """Run the action armed for ``name``, if any."""
    action = _ARMED.get(name)
    if action == "kill":
        log.warning("failpoint %s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stall":
        log.warning("failpoint %s: stalling this thread", name)
        time.sleep(3600)
